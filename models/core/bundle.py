"""Read a model bundle (what `python -m export` writes). No torch.

Repository layout (Triton's `<repository>/<model>/<version>/`):

    model_repository/
      multi30k-en-de-small/
        1/
          config.json          sizes, languages, special ids, graph signatures, variants
          encoder.onnx         decoder_step.onnx        (fp32)
          encoder.int8.onnx    decoder_step.int8.onnx   (int8, activations quantised per row; 7-bit weights)
          encoder.int8-vnni.onnx ...                    (int8-vnni: the same with 8-bit weights, for VNNI CPUs)
          encoder.int8-static.onnx ...                  (int8-static: activation ranges calibrated at export)
          decoder_inplace.onnx decoder_inplace.int8.onnx (optional: the step over the slot cache in place)
          weights.bin          weights.int8.bin         (tensors stored once: fp32's, then both int8
                                                         variants' quantised matrices; int8's fp32 tensors
                                                         point into weights.bin)
          tokenizer.json       (this repo's models; imported ones carry source.spm, vocab.json, ... instead)
          MODEL_CARD.md

Format versions: nmt-bundle/1 (tokenizer.json named by a string) still loads;
nmt-bundle/2 adds a `tokenizer` section naming its kind and files, a
`languages` section (the pairs served and the language tokens), and the
generation rules of imported models (suppressed ids, forced EOS at the limit).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from models.core.config import Dimensions

BUNDLE_FORMAT = "nmt-bundle/2"
READABLE_FORMATS = ("nmt-bundle/1", BUNDLE_FORMAT)
REQUIRED = ("encoder", "decoder_step")  # graphs every variant has
GRAPHS = REQUIRED + ("decoder_inplace", "decoder_inplace_std")  # _std: standard ops (export/inplace_standard.py)
FILES = GRAPHS + ("weights",)  # weights: the variant's external data, shared by its graphs (optional)


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec(Dimensions):
    """The parts of config.json a decoder needs, as plain fields."""
    vocab_size: int
    d_model: int
    n_heads: int
    n_enc_layers: int
    n_dec_layers: int
    pad_id: int
    bos_id: int
    eos_id: int
    max_positions: int
    tgt_vocab_size: Optional[int] = None
    suppress_ids: tuple[int, ...] = ()
    unk_id: Optional[int] = None


@dataclass(frozen=True)
class Languages:
    """Which language pairs a model serves and how a request's languages reach the model.

    target_rule: "none" (one target language, nothing to add), "source_prefix" (the target's
    token leads the source, Marian's >>fra<<), or "forced_bos" (the source's token leads the
    source and the target's is forced as the first output, M2M100/NLLB).
    """
    pairs: tuple[tuple[str, str], ...]
    source_tokens: dict[str, int] = field(default_factory=dict)
    target_tokens: dict[str, int] = field(default_factory=dict)
    target_rule: str = "none"

    @property
    def sources(self) -> list[str]:
        return sorted({s for s, _ in self.pairs})

    @property
    def targets(self) -> list[str]:
        return sorted({t for _, t in self.pairs})


@dataclass(frozen=True)
class Bundle:
    path: Path
    name: str
    version: int
    source_language: str
    target_language: str
    spec: ModelSpec
    variants: dict[str, dict[str, str]]  # variant -> {"encoder": file, "decoder_step": file[, "decoder_inplace": file]}
    tokenizer_file: Path  # tokenizer.json, or the source SentencePiece model of an imported one
    config: dict[str, Any] = field(repr=False)
    languages: Languages = field(default=None)

    @property
    def tokenizer_entry(self) -> str | dict[str, Any]:
        return self.config.get("tokenizer", "tokenizer.json")

    def graph_path(self, variant: str, graph: str) -> Path:
        if variant not in self.variants:
            raise BundleError(f"{self.name}/{self.version} has no variant {variant!r} "
                              f"(has {sorted(self.variants)})")
        return self.path / self.variants[variant][graph]


def load_bundle(path: str | Path) -> Bundle:
    """Parse and check one version directory; every problem is reported at once."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise BundleError(f"{path}: no config.json")
    config = json.loads(cfg_path.read_text())
    problems = []
    if config.get("format") not in READABLE_FORMATS:
        problems.append(f"format is {config.get('format')!r}; this server reads {', '.join(READABLE_FORMATS)} "
                        "(re-export the model with this version's `python -m export`)")
    model = config.get("model", {})
    optional = {"tgt_vocab_size", "suppress_ids"}
    missing = [k for k in ModelSpec.__dataclass_fields__ if k not in model and k not in optional]
    if missing:
        problems.append(f"model section lacks {', '.join(missing)}")
        spec = None
    else:
        spec = ModelSpec(**{k: tuple(model[k]) if k == "suppress_ids" else model[k]
                            for k in ModelSpec.__dataclass_fields__ if k in model})
    variants = config.get("variants", {})
    if "fp32" not in variants:
        problems.append("no fp32 variant")
    for name, files in variants.items():
        for graph in REQUIRED:
            if graph not in files:
                problems.append(f"variant {name} lacks {graph}")
        for graph, file in files.items():
            if graph not in FILES:
                problems.append(f"variant {name}: unknown file kind {graph!r} (known: {', '.join(FILES)})")
            elif not (path / file).exists():
                problems.append(f"variant {name}: {file} missing")
    entry = config.get("tokenizer", "tokenizer.json")
    if isinstance(entry, str):
        tok_files = [entry]
    elif entry.get("kind") == "sentencepiece":
        tok_files = [entry[k] for k in ("source_model", "target_model", "vocab", "target_vocab") if entry.get(k)]
    elif entry.get("kind") == "tokenizer.json":
        tok_files = [entry["file"]]
    else:
        problems.append(f"unknown tokenizer kind {entry.get('kind')!r} "
                        "(known: a tokenizer.json name, sentencepiece, tokenizer.json)")
        tok_files = []
    for name in tok_files:
        if not (path / name).exists():
            problems.append(f"tokenizer file {name} missing")
    if problems:
        raise BundleError(f"{path}: " + "; ".join(problems))
    src, tgt = config["source_language"], config["target_language"]
    lang = config.get("languages") or {}
    languages = Languages(pairs=tuple(tuple(p) for p in lang.get("pairs", [[src, tgt]])),
                          source_tokens=lang.get("source_tokens", {}), target_tokens=lang.get("target_tokens", {}),
                          target_rule=lang.get("target_rule", "none"))
    if languages.target_rule not in ("none", "source_prefix", "forced_bos"):
        raise BundleError(f"{path}: unknown languages.target_rule {languages.target_rule!r}")
    return Bundle(path=path, name=config["name"], version=int(config["version"]), source_language=src,
                  target_language=tgt, spec=spec, variants=variants, tokenizer_file=path / tok_files[0],
                  config=config, languages=languages)


def newest_version(model_dir: str | Path) -> Path | None:
    """<model>/<highest version number>/, or None when the folder holds no version."""
    model_dir = Path(model_dir)
    versions = sorted((int(v.name), v) for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit()) \
        if model_dir.is_dir() else []
    return versions[-1][1] if versions else None


def discover(repository: str | Path) -> list[Bundle]:
    """Every model in a repository, at its highest version number."""
    repository = Path(repository)
    if not repository.is_dir():
        raise BundleError(f"model repository {repository} is not a directory")
    found = []
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        newest = newest_version(model_dir)
        if newest is not None:
            found.append(load_bundle(newest))
    if not found:
        raise BundleError(f"no bundles under {repository} (expected <model>/<version>/config.json)")
    return found
