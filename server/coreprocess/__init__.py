"""The engine core in a process of its own (`--engine-core process`): protocol.py (the messages),
process.py (the core: models, engine loops, one ZeroMQ socket), link.py (a frontend's side),
supervisor.py (start, watch and restart the core). docs/architecture.md has the picture."""
