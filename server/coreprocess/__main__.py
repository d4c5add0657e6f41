"""python -m server.coreprocess --config FILE --address ADDR --parent PID: the engine core process,
started by a frontend's supervisor (server/coreprocess/supervisor.py), never by hand."""
from __future__ import annotations

import argparse
import json
import os

if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m server.coreprocess", description=__doc__)
    p.add_argument("--config", required=True, help="the server's settings as JSON (written by the supervisor)")
    p.add_argument("--address", required=True, help="ZeroMQ address to bind, ipc://...")
    p.add_argument("--parent", type=int, required=True, help="the frontend's pid: the core exits when it is gone")
    p.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much first "
                   "(the background replica: 19); every thread started later inherits it")
    args = p.parse_args()
    if args.nice:
        os.nice(args.nice)  # before numpy, ONNX Runtime and the engine thread start theirs
    from server.config import ServerConfig
    from server.coreprocess.process import main
    with open(args.config, encoding="utf-8") as f:
        settings = json.load(f)
    settings["model"] = tuple(settings.get("model", ()))
    main(ServerConfig(**settings), args.address, args.parent)
