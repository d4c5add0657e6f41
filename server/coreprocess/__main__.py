"""python -m server.coreprocess --config FILE --address ADDR --parent PID: the engine core process,
started by a frontend's supervisor (server/frontend/cores/supervisor.py), never by hand."""
from __future__ import annotations

import argparse
import json
import os

if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m server.coreprocess", description=__doc__)
    p.add_argument("--config", required=True, help="the server's settings as JSON (written by the supervisor)")
    p.add_argument("--address", required=True, help="the Unix socket path to listen on for the frontends (server/coreprocess/channel.py)")
    p.add_argument("--parent", type=int, required=True, help="the frontend's pid: the core exits when it is gone")
    p.add_argument("--pieces", default="", help="each model's vocabulary pieces as JSON (written by the "
                   "supervisor from the frontend's tokenizers): the core then loads no tokenizer")
    p.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much first "
                   "(the background replica: 19); every thread started later inherits it")
    args = p.parse_args()
    from models.core.heap import limit_malloc_arenas
    limit_malloc_arenas()  # before the engine, socket and ONNX Runtime threads start
    if args.nice:
        os.nice(args.nice)  # before numpy, ONNX Runtime and the engine thread start theirs
    from server.config import ServerConfig
    from server.coreprocess.process import main
    with open(args.config, encoding="utf-8") as f:
        settings = json.load(f)
    settings["model"] = tuple(settings.get("model", ()))
    pieces = {}
    if args.pieces:
        with open(args.pieces, encoding="utf-8") as f:
            pieces = {name: tuple(p) for name, p in json.load(f).items()}
    # the background replica (niced) takes only background work: its row costs would never be read
    main(ServerConfig(**settings), args.address, args.parent, pieces, measure=not args.nice)
