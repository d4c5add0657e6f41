"""Read a model bundle (what `python -m export` writes). No torch.

Repository layout (Triton's `<repository>/<model>/<version>/`):

    model_repository/
      multi30k-en-de-small/
        1/
          config.json          sizes, languages, special ids, graph signatures, variants
          encoder.onnx         decoder_step.onnx        (fp32)
          encoder.int8.onnx    decoder_step.int8.onnx   (int8, activations quantised per row)
          decoder_inplace.onnx decoder_inplace.int8.onnx (optional: the step over the slot cache in place)
          weights.bin          weights.int8.bin         (each variant's tensors, stored once for its graphs)
          tokenizer.json
          MODEL_CARD.md
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUNDLE_FORMAT = "nmt-bundle/1"
REQUIRED = ("encoder", "decoder_step")  # graphs every variant has
GRAPHS = REQUIRED + ("decoder_inplace",)
FILES = GRAPHS + ("weights",)  # weights: the variant's external data, shared by its graphs (optional)


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class Bundle:
    path: Path
    name: str
    version: int
    source_language: str
    target_language: str
    spec: ModelSpec
    variants: dict[str, dict[str, str]]  # variant -> {"encoder": file, "decoder_step": file[, "decoder_inplace": file]}
    tokenizer_file: Path
    config: dict[str, Any] = field(repr=False)

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
    if config.get("format") != BUNDLE_FORMAT:
        problems.append(f"format is {config.get('format')!r}, expected {BUNDLE_FORMAT!r}")
    model = config.get("model", {})
    try:
        spec = ModelSpec(**{k: model[k] for k in ModelSpec.__dataclass_fields__})
    except KeyError as e:
        problems.append(f"model section lacks {e}")
        spec = None
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
    tok = path / config.get("tokenizer", "tokenizer.json")
    if not tok.exists():
        problems.append(f"{tok.name} missing")
    if problems:
        raise BundleError(f"{path}: " + "; ".join(problems))
    return Bundle(path=path, name=config["name"], version=int(config["version"]),
                  source_language=config["source_language"], target_language=config["target_language"],
                  spec=spec, variants=variants, tokenizer_file=tok, config=config)


def discover(repository: str | Path) -> list[Bundle]:
    """Every model in a repository, at its highest version number."""
    repository = Path(repository)
    if not repository.is_dir():
        raise BundleError(f"model repository {repository} is not a directory")
    found = []
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        versions = sorted((int(v.name), v) for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit())
        if versions:
            found.append(load_bundle(versions[-1][1]))
    if not found:
        raise BundleError(f"no bundles under {repository} (expected <model>/<version>/config.json)")
    return found
