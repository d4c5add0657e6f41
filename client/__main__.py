"""Command line client.

    python -m client translate "A man is riding a bike." [--stream] [--beam 5] [--target host:port]
    python -m client embed "A dog." "A cat." [--normalize]
    python -m client models
    python -m client health
    python -m client translate-file INPUT [-o OUTPUT] [--target a:50051,b:50051] [--concurrency 8]
        (text, JSONL or TSV, resumable; or a document: docx, pptx, xlsx, odt, srt, xliff, po, html...;
        see docs/translate_file.md)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

import grpc

from client.balancing import POLICIES, Balancing
from client.client import TranslatorClient


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    """TLS and API-key options (docs/security.md). The key comes from NMT_API_KEY by default: a key given
    with --api-key shows in the process list and the shell history."""
    g = p.add_argument_group("security")
    g.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    g.add_argument("--ca-file", help="PEM root certificate(s) to trust for the server (implies TLS)")
    g.add_argument("--cert-file", help="client certificate chain, PEM (mutual TLS; with --key-file)")
    g.add_argument("--key-file", help="client private key, PEM")
    g.add_argument("--server-name", help="name to expect in the server's certificate, if not the target's host")
    g.add_argument("--api-key", default=os.environ.get("NMT_API_KEY"),
                   help="sent as metadata 'authorization: Bearer KEY' (default: env NMT_API_KEY)")


def security_kwargs(args: argparse.Namespace) -> dict:
    return dict(tls=args.tls, ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file,
                server_name=args.server_name, api_key=args.api_key)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="localhost:50051",
                   help="server (or balancer) host:port; several replicas: a comma-separated list, dns:///name:port "
                        "(every address of the name) or ipv4:a:p,b:p, balanced round_robin (docs/deployment.md)")
    p.add_argument("--lb", choices=POLICIES, default="auto",
                   help="load-balancing policy: auto = round_robin for several replicas, else pick_first")
    p.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")
    add_security_arguments(p)
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
    t.add_argument("--repetition-penalty", type=float, help="> 1 discourages repeating output tokens (0, 10]")
    t.add_argument("--no-repeat-ngram-size", type=int, default=0, help="no n-gram of this size twice (0 = off)")
    t.add_argument("--min-output-tokens", type=int, default=0, help="no end of sentence before this many tokens")
    t.add_argument("--no-unk", action="store_true", help="never generate the unknown token")
    t.add_argument("--prefix", default="", help="the translation starts with this text (target_prefix)")
    t.add_argument("--alternatives", type=int, default=0,
                   help="print N alternatives at the first position after --prefix, one per line")
    t.add_argument("--json", action="store_true", help="print the whole response as JSON")
    e = sub.add_parser("embed", help="mean-pooled encoder vectors")
    e.add_argument("texts", nargs="+")
    e.add_argument("--model", default="")
    e.add_argument("--normalize", action="store_true")
    sub.add_parser("models", help="list the loaded models")
    sub.add_parser("health", help="the server's health status")
    from client import translate_file
    f = sub.add_parser("translate-file", help="translate a file (text, JSONL, TSV: batched, concurrent, resumable; "
                                              "or a document: docx, pptx, xlsx, odt, srt, xliff, po, html)",
                       description=translate_file.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    translate_file.add_arguments(f)
    args = p.parse_args(argv)
    if args.cmd == "translate-file":
        return translate_file.main_args(args)
    try:
        with TranslatorClient(args.target, timeout=args.timeout, balancing=Balancing(lb=args.lb),
                              **security_kwargs(args)) as c:
            return run(c, args)
    except grpc.RpcError as err:
        print(f"error: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:  # an unreadable --ca-file, --cert-file without --key-file
        print(f"error: {err}", file=sys.stderr)
        return 2


def run(c: TranslatorClient, args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict
    if args.cmd == "translate":
        texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
        decoding = dict(beam_size=args.beam, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, max_output_tokens=args.max_output_tokens,
                        repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
                        min_output_tokens=args.min_output_tokens, no_unknown_token=args.no_unk,
                        target_prefix=args.prefix, alternatives=args.alternatives)
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
                for hyp in tr.hypotheses[:max(args.alternatives, 1)]:
                    print(hyp.text)
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
