"""Quality and parity of a bundle against its PyTorch checkpoint on a test set.

    python -m export.quality --checkpoint models/pretrained/multi30k-en-de-small/model.pt \\
        --bundle model_repository/multi30k-en-de-small/4 --out docs/quality.json

Measures sacreBLEU (cased, detokenised) for PyTorch greedy and beam, for the
ONNX Runtime + numpy decoder (fp32 and int8) with greedy and beam, the share
of sentences whose tokens are identical to PyTorch's, and the int8 speed-up
(same decoder, same batches, one process). The int8 variant is built in a
temporary folder when the bundle has none.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import sacrebleu
import torch

from export.parity import token_parity
from models.core.bundle import load_bundle
from models.core.runtime import OnnxModel, RuntimeOptions, cpu_has_vnni
from models.core.tokenizer import normalize
from models.evaluate import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


METRIC = sacrebleu.BLEU()  # one object, so its signature is the one every score used


def bleu(hyps: list[str], refs: list[str]) -> float:
    return round(METRIC.corpus_score(hyps, [refs]).score, 2)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--bundle", required=True)
    p.add_argument("--src-file", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en"))
    p.add_argument("--ref-file", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.de"))
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    p.add_argument("--variants", default="", help="only these variants besides fp32, e.g. int8-static (default: "
                   "int8, int8-static where the bundle has it, int8-vnni where this CPU has VNNI)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    model, tok, _ = load_checkpoint(args.checkpoint)
    src = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    refs = [normalize(r) for r in Path(args.ref_file).read_text(encoding="utf-8").splitlines()]
    if args.limit:
        src, refs = src[: args.limit], refs[: args.limit]
    ids = [tok.encode(normalize(s)) for s in src]
    bundle_dir = Path(args.bundle)
    with tempfile.TemporaryDirectory() as tmp:
        if "int8" not in load_bundle(bundle_dir).variants:
            subprocess.run([sys.executable, "-m", "export", "--checkpoint", args.checkpoint, "--out", tmp,
                            "--name", "q", "--int8"], check=True, cwd=ROOT)
            bundle_dir = Path(tmp) / "q" / "1"
        bundle = load_bundle(bundle_dir)
        result = {"sentences": len(src), "beam": args.beam, "alpha": args.alpha, "torch": torch.__version__}
        reference: dict[str, list[list[int]]] = {}  # PyTorch outputs, decoded once per mode
        # int8 with 7-bit weights and rows quantised while serving (every CPU), int8-static (calibrated ranges),
        # and int8-vnni (8-bit) where this CPU sums them exactly
        variants = ["fp32", "int8"] + [v for v in ("int8-static", "int8-vnni") if v in bundle.variants
                                       and (v != "int8-vnni" or cpu_has_vnni())]
        if args.variants:
            variants = ["fp32"] + [v for v in args.variants.split(",") if v in bundle.variants]
        for variant in variants:
            onnx_model = OnnxModel(bundle, RuntimeOptions(variant=variant, provider="cpu", int8_weights="7",
                                                          int8_activations="row"))
            for beam in (1, args.beam):
                t0 = time.perf_counter()
                name = "greedy" if beam == 1 else f"beam{beam}"
                par = token_parity(model, onnx_model, ids, beam=beam, alpha=args.alpha,
                                   torch_ids=reference.get(name))
                reference[name] = par.torch_ids
                torch_bleu = bleu([tok.decode(x) for x in par.torch_ids], refs)
                result.setdefault("pytorch", {})[name] = torch_bleu
                result[f"onnx_{variant}_{name}"] = {
                    "bleu": bleu([tok.decode(x) for x in par.onnx_ids], refs),
                    "identical_to_pytorch": round(par.ratio, 4), "seconds": round(time.perf_counter() - t0, 1)}
                print(f"{variant} {name}: {result[f'onnx_{variant}_{name}']} (pytorch {torch_bleu})",
                      file=sys.stderr, flush=True)
            # Speed of the ONNX decoder alone (no PyTorch in the timing), greedy, batch 32.
            from models.core.static_decode import greedy, pad_batch
            t0 = time.perf_counter()
            for i in range(0, len(ids), 32):
                greedy(onnx_model, *pad_batch(ids[i:i + 32], tok.pad_id))
            result[f"onnx_{variant}_greedy"]["decode_seconds"] = round(time.perf_counter() - t0, 2)
    result["signature"] = str(METRIC.get_signature())
    for variant in variants[1:]:
        result[f"{variant.replace('-', '_')}_speedup_greedy_b32"] = round(
            result["onnx_fp32_greedy"]["decode_seconds"] / result[f"onnx_{variant}_greedy"]["decode_seconds"], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
