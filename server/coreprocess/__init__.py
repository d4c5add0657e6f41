"""The engine core (server/core/) in a process of its own (`--engine-core process`), the core's side:
protocol.py (the messages between a frontend and a core), channel.py (their transport: framed messages
over one Unix socket per frontend), process.py (the core process: models, engine loops, the listening
socket), __main__.py (`python -m server.coreprocess`). The frontend's side of the same link is
server/frontend/cores/. docs/architecture.md has the picture."""
