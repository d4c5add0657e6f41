"""The frontend's side of the engine core processes (server/coreprocess/ is the core's): link.py (one
core's connection: jobs out, events in), supervisor.py (start, watch and restart a core; in an extra
frontend, follow it), replicas.py (every replica, and the background one), placement.py (which
replica takes a call)."""
