"""The engine core (server/core/) in a process of its own (`--engine-core process`): protocol.py (the
messages), channel.py (their transport: framed messages over one Unix socket per frontend),
process.py (the core process: models, engine loops, the listening socket), link.py (a frontend's side
of it), supervisor.py (start, watch and restart the core; or, in an extra frontend,
follow it), frontends.py (the primary's extra frontend processes, `--frontends N`) and frontend.py
(one of them). docs/architecture.md has the picture."""
