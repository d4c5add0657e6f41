"""python -m server.coreprocess --config FILE --address ADDR --parent PID: the engine core process,
started by a frontend's supervisor (server/coreprocess/supervisor.py), never by hand."""
from __future__ import annotations

import argparse
import json

from server.config import ServerConfig
from server.coreprocess.process import main

if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m server.coreprocess", description=__doc__)
    p.add_argument("--config", required=True, help="the server's settings as JSON (written by the supervisor)")
    p.add_argument("--address", required=True, help="ZeroMQ address to bind, ipc://...")
    p.add_argument("--parent", type=int, required=True, help="the frontend's pid: the core exits when it is gone")
    args = p.parse_args()
    with open(args.config, encoding="utf-8") as f:
        settings = json.load(f)
    settings["model"] = tuple(settings.get("model", ()))
    main(ServerConfig(**settings), args.address, args.parent)
