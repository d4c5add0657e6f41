"""Command line client.

    python -m client translate "A man is riding a bike." [--stream] [--beam 5] [--target host:port]
    python -m client embed "A dog." "A cat." [--normalize]
    python -m client models
    python -m client health
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import grpc

from client.client import TranslatorClient


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="localhost:50051", help="server host:port")
    p.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("translate", help="translate texts (default: one per line on stdin)")
    t.add_argument("texts", nargs="*")
    t.add_argument("--model", default="")
    t.add_argument("--stream", action="store_true", help="print text as it is decoded")
    t.add_argument("--beam", type=int, default=0)
    t.add_argument("--temperature", type=float, default=0.0)
    t.add_argument("--top-k", type=int, default=0)
    t.add_argument("--top-p", type=float, default=0.0)
    t.add_argument("--seed", type=int)
    t.add_argument("--max-output-tokens", type=int, default=0)
    t.add_argument("--json", action="store_true", help="print the whole response as JSON")
    e = sub.add_parser("embed", help="mean-pooled encoder vectors")
    e.add_argument("texts", nargs="+")
    e.add_argument("--model", default="")
    e.add_argument("--normalize", action="store_true")
    sub.add_parser("models", help="list the loaded models")
    sub.add_parser("health", help="the server's health status")
    args = p.parse_args(argv)
    try:
        with TranslatorClient(args.target, timeout=args.timeout) as c:
            return run(c, args)
    except grpc.RpcError as err:
        print(f"error: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1


def run(c: TranslatorClient, args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict
    if args.cmd == "translate":
        texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
        decoding = dict(beam_size=args.beam, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, max_output_tokens=args.max_output_tokens)
        if args.stream:
            for text in texts:
                for msg in c.translate_stream(text, model=args.model, **decoding):
                    print(msg.delta, end="", flush=True)
                print()
            return 0
        resp = c.translate(texts, model=args.model, return_scores=args.json, **decoding)
        if args.json:
            print(json.dumps(MessageToDict(resp), indent=2, ensure_ascii=False))
        else:
            for tr in resp.translations:
                print(tr.hypotheses[0].text)
    elif args.cmd == "embed":
        resp = c.embed(args.texts, model=args.model, normalize=args.normalize)
        for emb in resp.embeddings:
            print(json.dumps([round(v, 6) for v in emb.values]))
    elif args.cmd == "models":
        print(json.dumps(MessageToDict(c.list_models()), indent=2))
    else:
        status = c.health()
        print(status)
        return 0 if status == "SERVING" else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
