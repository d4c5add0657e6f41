"""Export a checkpoint to a model bundle: check everything, report every problem, then save.

    python -m export --checkpoint models/pretrained/multi30k-en-de-small/model.pt \\
        --out model_repository [--name multi30k-en-de-small] [--version 1] [--int8] [--fp16]
    python -m export --from-huggingface ./opus-mt-en-de --out model_repository      # or a hub id

Writes <out>/<name>/<version>/ (Triton's repository layout) with encoder.onnx,
decoder_step.onnx, decoder_inplace.onnx (dot attention), the optional variants, tokenizer.json, config.json,
MODEL_CARD.md (when one sits beside the checkpoint) and README.md (the graph
signatures). Nothing is written into <out> unless every check passes.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import onnx

from export import inplace
from export.inplace_standard import export_standard
from export import onnx as graphs
from export.parity import graph_parity, inplace_parity
from export.calibrate import CALIBRATION_PERCENTILE, default_calibration, encode_sources, measure, ranges_for
from export.quantize import DECODER_MIN_WEIGHTS, VNNI_WEIGHT_BITS, WEIGHT_BITS
from export.quantize_static import quantize_static
from export.variants import fp16_graphs, quantize_int8
from export.weights import share_weights
from models.core.bundle import BUNDLE_FORMAT, load_bundle
from models.core.runtime import OnnxModel, RuntimeOptions, cpu_has_vnni
from models.core.bundle_tokenizer import load_tokenizer
from models.evaluate import load_checkpoint

FP32_TOLERANCE = 1e-4  # max abs diff, any output, any parity case
INT8_LOGIT_TOLERANCE = 2.0  # sanity bound only; int8 quality is judged by BLEU in the model card


def _io_signature(model: onnx.ModelProto) -> dict[str, list[dict]]:
    def describe(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            out.append({"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                        "shape": dims})
        return out
    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


def check_graph(path: Path, inputs: list[str], outputs: list[str], axes: dict, opset: int) -> list[str]:
    """Structural checks on one exported graph: checker, opset, names, symbolic axes."""
    problems = []
    model = onnx.load(str(path))
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 (report the checker's words, whatever they are)
        problems.append(f"{path.name}: onnx checker: {e}")
    got_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if got_opset != opset:
        problems.append(f"{path.name}: opset {got_opset}, expected {opset}")
    sig = _io_signature(model)
    for kind, want in (("inputs", inputs), ("outputs", outputs)):
        got = [v["name"] for v in sig[kind]]
        if got != want:
            problems.append(f"{path.name}: {kind} {got}, expected {want}")
    for v in sig["inputs"] + sig["outputs"]:
        for axis, label in axes.get(v["name"], {}).items():
            if axis >= len(v["shape"]) or v["shape"][axis] != label:
                problems.append(f"{path.name}: {v['name']} axis {axis} is {v['shape'][axis] if axis < len(v['shape']) else 'missing'}, "
                                f"expected dynamic {label!r}")
    return problems


def _parity_problems(label: str, diffs) -> list[str]:
    """Report the worst difference; a problem if it exceeds the fp32 tolerance."""
    worst = max(diffs, key=lambda d: d.max_abs_diff)
    print(f"{label}: worst max|diff| {worst.max_abs_diff:.2e} ({worst.output}, case {worst.case})", file=sys.stderr)
    if worst.max_abs_diff <= FP32_TOLERANCE:
        return []
    return [f"{label}: {worst.output} differs by {worst.max_abs_diff:.2e} in case {worst.case} "
            f"(tolerance {FP32_TOLERANCE})"]


def build_config(args, cfg, meta: dict, variants: dict, signatures: dict, imported=None) -> dict:
    extra = {} if imported is None else {"tokenizer": imported.tokenizer_entry, "languages": imported.languages,
                                         "generation": imported.generation,
                                         "imported_from": {k: meta[k] for k in ("source", "model_type")}}
    return {
        "format": BUNDLE_FORMAT,
        "name": args.name,
        "version": args.version,
        "source_language": meta.get("src_lang", args.src_lang),
        "target_language": meta.get("tgt_lang", args.tgt_lang),
        "model": cfg.to_dict(),
        "opset": args.opset,
        "limits": {"max_source_tokens": cfg.max_positions, "max_output_tokens": cfg.max_positions - 1},
        "decoding_defaults": {"beam": 5, "length_penalty": 1.0},
        "tokenizer": "tokenizer.json",
        "variants": variants,
        # Read by models/core/runtime.py: int8 graphs of 8-bit weights are wrong on CPUs without VNNI.
        **({"int8_weight_bits": WEIGHT_BITS} if "int8" in variants else {}),
        "signatures": signatures,
        "trained": {k: meta[k] for k in ("corpus", "epoch", "step", "val_bleu_greedy") if k in meta},
        **extra,
    }


def _static_int8(args, model, imported, meta: dict, stage: Path, paths: dict, kinds: list, variants: dict) -> list[str]:
    """Calibrate on the fp32 graphs and write the int8-static variant (export/quantize_static.py) into `stage`;
    its problems (a product of these graphs without a calibrated range). Nothing when no calibration text."""
    if args.calibration_text:
        path = Path(args.calibration_text)
        if not path.is_file():
            return [f"--calibration-text {path}: no such file"]
        found = (str(path), path.read_text(encoding="utf-8").splitlines())
    else:
        found = default_calibration(meta, meta.get("src_lang", args.src_lang), meta.get("tgt_lang", args.tgt_lang))
    if found is None:
        print("int8-static not written: no calibration text (--calibration-text)", file=sys.stderr)
        return []
    text, lines = found
    encode = load_tokenizer("tokenizer.json" if imported is None else imported.tokenizer_entry, stage).encode
    sources, spec = encode_sources(lines, encode, args.calibration_sentences), model.cfg
    if not sources:
        return [f"int8-static: the calibration text ({text}) has no sentence"]
    print(f"calibrating int8-static on {len(sources)} sentences of {text}", file=sys.stderr)
    ranges = measure(paths["encoder"], paths["decoder"], sources, spec.pad_id, spec.bos_id, spec.eos_id,
                     CALIBRATION_PERCENTILE)
    problems, variants["int8-static"] = [], {}
    for kind, key in kinds:
        by_input, missing = ranges_for(onnx.load(str(paths[key])), ranges)
        problems += [f"int8-static {kind}: {m}" for m in missing]
        variants["int8-static"][kind] = f"{kind}.int8-static.onnx"
        count = quantize_static(paths[key], stage / variants["int8-static"][kind], by_input)
        print(f"int8-static {kind}: {count} products in int8", file=sys.stderr)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a checkpoint written by models.train / models.average")
    source.add_argument("--from-huggingface", metavar="DIR_OR_HUB_ID",
                        help="a Hugging Face MarianMT (OPUS-MT) or M2M100 checkpoint: a local directory, or a hub "
                             "id downloaded through huggingface_hub (needs `pip install .[export]`)")
    p.add_argument("--out", required=True, help="model repository folder")
    p.add_argument("--name", help="model name (default: the checkpoint's folder name)")
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--src-lang", help="source language, when the checkpoint does not record it (default en)")
    p.add_argument("--tgt-lang", help="target language, when the checkpoint does not record it (default de)")
    p.add_argument("--opset", type=int, default=graphs.OPSET)
    p.add_argument("--int8", action="store_true",
                   help="also write the int8 variant (activations quantised per row: batch-invariant)")
    p.add_argument("--calibration-text", metavar="FILE",
                   help="with --int8: source-language sentences, one per line, whose greedy decoding measures the "
                        "activation ranges of the int8-static variant (default: the validation split of the corpus "
                        "the checkpoint was trained on, where ../shared/data has it; without any, int8-static is "
                        "not written)")
    p.add_argument("--calibration-sentences", type=int, default=500,
                   help="how many calibration sentences to decode (the first N non-empty lines)")
    p.add_argument("--fp16", action="store_true", help="also write the fp16 (GPU) variant")
    p.add_argument("--no-inplace", action="store_true",
                   help="skip decoder_inplace.onnx (the engine then copies the cache into decoder_step.onnx each step)")
    p.add_argument("--force", action="store_true", help="replace an existing <name>/<version>")
    args = p.parse_args(argv)
    imported = None
    if args.from_huggingface:
        from export.huggingface import ImportProblems, import_checkpoint
        try:
            imported = import_checkpoint(args.from_huggingface, args.src_lang, args.tgt_lang)
        except ImportProblems as e:
            print(f"cannot import {args.from_huggingface}: {len(e.problems)} problem(s); nothing written:",
                  file=sys.stderr)
            for item in e.problems:
                print(f"  - {item}", file=sys.stderr)
            return 1
        model, tok, meta = imported.model, None, imported.meta
        ckpt = imported.hf_dir / "config.json"
        args.name = args.name or Path(args.from_huggingface.rstrip("/")).name
    else:
        ckpt = Path(args.checkpoint)
        args.name = args.name or ckpt.parent.name
        model, tok, meta = load_checkpoint(ckpt)
    args.src_lang, args.tgt_lang = args.src_lang or "en", args.tgt_lang or "de"
    target = Path(args.out) / args.name / str(args.version)
    if target.exists() and not args.force:
        print(f"error: {target} exists (use --force to replace it)", file=sys.stderr)
        return 2

    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bundle-", dir=Path(args.out).parent if Path(args.out).parent.exists() else None) as tmp:
        stage = Path(tmp) / "bundle"
        print(f"exporting {args.name} v{args.version} ({model.num_parameters():,} parameters)", file=sys.stderr)
        paths = graphs.export_graphs(model, stage, args.opset)
        if imported is None:
            tok.save(stage / "tokenizer.json")
        else:
            for name, src in imported.tokenizer_files.items():
                shutil.copy(src, stage / name)
        problems += check_graph(paths["encoder"], graphs.ENCODER_INPUTS, graphs.ENCODER_OUTPUTS,
                                graphs.ENCODER_AXES, args.opset)
        problems += check_graph(paths["decoder"], graphs.DECODER_INPUTS, graphs.DECODER_OUTPUTS,
                                graphs.DECODER_AXES, args.opset)
        variants = {"fp32": {"encoder": "encoder.onnx", "decoder_step": "decoder_step.onnx"}}
        # GroupQueryAttention: dot-product scores only, head size a multiple of 8.
        with_inplace = model.cfg.attention == "dot" and model.cfg.head_dim % 8 == 0 and not args.no_inplace
        if not with_inplace and not args.no_inplace:
            print("no decoder_inplace.onnx: it needs dot attention and a head size divisible by 8", file=sys.stderr)
        if with_inplace:
            paths["inplace"] = inplace.export_inplace(model, stage / "decoder_inplace.onnx", args.opset)
            in_names, out_names = inplace.io_names(model.cfg.n_dec_layers)
            problems += check_graph(paths["inplace"], in_names, out_names, inplace.io_axes(model.cfg.n_dec_layers),
                                    args.opset)
            variants["fp32"]["decoder_inplace"] = "decoder_inplace.onnx"
        if args.int8:
            # Both weight widths from one export: the runtime serves 8-bit where the CPU sums byte products
            # exactly (VNNI), 7-bit elsewhere (export/quantize.py).
            kinds = [("encoder", "encoder"), ("decoder_step", "decoder")] + \
                ([("decoder_inplace", "inplace")] if with_inplace else [])
            for variant, bits in (("int8", WEIGHT_BITS), ("int8-vnni", VNNI_WEIGHT_BITS)):
                print(f"quantizing to {variant} ({bits}-bit weights)", file=sys.stderr)
                variants[variant] = {}
                for kind, key in kinds:
                    variants[variant][kind] = f"{kind}.{variant}.onnx"
                    quantize_int8(paths[key], stage / variants[variant][kind], bits,
                                  0 if kind == "encoder" else DECODER_MIN_WEIGHTS)
            problems += _static_int8(args, model, imported, meta, stage, paths, kinds, variants)
        if args.fp16:
            print("converting to fp16", file=sys.stderr)
            variants["fp16"] = fp16_graphs(stage, variants["fp32"])
        for key in ("decoder", "inplace"):
            if key in paths:
                saved = graphs.share_tied_embedding(paths[key])
                print(f"tied embedding shared in {paths[key].name}: {saved / 2**20:.1f} MiB saved", file=sys.stderr)
        if with_inplace:  # the same step in standard ops, for providers without GQA's fp32 kernels (CUDA)
            paths["inplace_std"], std_problems = export_standard(
                paths["inplace"], stage / "decoder_inplace.std.onnx", model.cfg.n_heads, model.cfg.head_dim)
            problems += std_problems
            if not std_problems:
                variants["fp32"]["decoder_inplace_std"] = "decoder_inplace.std.onnx"
        # One weights file per variant, written fp32 first, except that int8 and int8-vnni share
        # weights.int8.bin (their quantised matrices), and their fp32 tensors (the embedding, norms, biases)
        # point into fp32's weights.bin instead of being stored again.
        by_file: dict[str, list[str]] = {}
        for variant in variants:
            weights = "weights.bin" if variant == "fp32" else f"weights.{variant.split('-')[0]}.bin"
            by_file.setdefault(weights, []).append(variant)
        fp32_index = None
        for weights, sharing in by_file.items():
            graph_files = [stage / f for v in sharing for f in variants[v].values()]
            before, after, index = share_weights(graph_files, stage / weights,
                                                 fp32_index if weights == "weights.int8.bin" else None)
            if weights == "weights.bin":
                fp32_index = index
            for v in sharing:
                variants[v]["weights"] = weights
            print(f"{', '.join(sharing)}: {len(graph_files)} graphs share {weights}: {before / 2**20:.1f} -> "
                  f"{after / 2**20:.1f} MiB of weights", file=sys.stderr)
        signatures = {"encoder": _io_signature(onnx.load(str(paths["encoder"]))),
                      "decoder_step": _io_signature(onnx.load(str(paths["decoder"])))}
        if with_inplace:
            signatures["decoder_inplace"] = _io_signature(onnx.load(str(paths["inplace"])))
        if "decoder_inplace_std" in variants["fp32"]:
            signatures["decoder_inplace_std"] = _io_signature(onnx.load(str(paths["inplace_std"])))
        config = build_config(args, model.cfg, meta, variants, signatures, imported)
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        card = ckpt.parent / "MODEL_CARD.md"
        if card.exists() and imported is None:
            shutil.copy(card, stage / "MODEL_CARD.md")
        elif imported is not None:
            (stage / "MODEL_CARD.md").write_text(
                f"# {args.name}\n\nImported from the Hugging Face checkpoint `{meta['source']}` "
                f"({meta['model_type']}) by `python -m export --from-huggingface`; see the original model card "
                "for its training data, quality and licence.\n")
        docs = [graphs.__doc__.strip()] + ([inplace.__doc__.strip()] if with_inplace else [])
        (stage / "README.md").write_text("# Bundle graphs\n\n" + "\n\n".join(f"```\n{d}\n```" for d in docs) + "\n")

        if imported is not None:  # ours == transformers, before ours == ONNX below
            from export.huggingface import reference_parity
            diff, tok_problems = reference_parity(imported, imported.reference,
                                                  load_tokenizer(imported.tokenizer_entry, stage))
            print(f"transformers parity: worst max|logit diff| {diff:.2e}", file=sys.stderr)
            problems += tok_problems
            if diff > FP32_TOLERANCE:
                problems.append(f"logits differ from transformers' by {diff:.2e} (tolerance {FP32_TOLERANCE})")

        # Parity, through the same loader and runtime the server uses.
        bundle = load_bundle(stage)
        fp32 = OnnxModel(bundle, RuntimeOptions(variant="fp32", provider="cpu"))
        problems += _parity_problems("fp32 parity", graph_parity(model, fp32))
        if with_inplace:
            problems += _parity_problems("fp32 in-place parity", inplace_parity(model, fp32.inplace))
        if "decoder_inplace_std" in variants["fp32"]:
            std = OnnxModel(bundle, RuntimeOptions(variant="fp32", provider="cpu", decoder="standard"))
            problems += _parity_problems("fp32 standard-op in-place parity", inplace_parity(model, std.inplace))
        if args.int8:
            # int8-vnni's products are exact only on a CPU with VNNI: checked where this export runs on one.
            vnni = cpu_has_vnni()
            for variant in [v for v in ("int8", "int8-vnni", "int8-static") if v in variants
                            and (vnni or v != "int8-vnni")]:
                int8 = OnnxModel(bundle, RuntimeOptions(variant=variant, provider="cpu", int8_weights="7",
                                                        int8_activations="row"))
                worst8 = max((d for d in graph_parity(model, int8) if d.output == "logits"),
                             key=lambda d: d.max_abs_diff)
                print(f"{variant} logits: worst max|diff| {worst8.max_abs_diff:.3f}", file=sys.stderr)
                if worst8.max_abs_diff > INT8_LOGIT_TOLERANCE:
                    problems.append(f"{variant} logits differ by {worst8.max_abs_diff:.2f} "
                                    f"(sanity bound {INT8_LOGIT_TOLERANCE})")
            if not vnni:
                print("int8-vnni not checked: this CPU has no VNNI (its 8-bit products saturate here)", file=sys.stderr)

        if problems:
            print(f"export failed with {len(problems)} problem(s); nothing written:", file=sys.stderr)
            for item in problems:
                print(f"  - {item}", file=sys.stderr)
            return 1
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(stage), str(target))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
