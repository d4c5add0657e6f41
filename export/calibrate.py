"""Activation ranges for static int8, measured on the model's own decoding of calibration text.

Static int8 (export/quantize_static.py) quantises each product's input with one constant scale and zero
point, chosen here once: the fp32 graphs run greedy decoding of calibration sentences (the model's own
outputs, so the decoder sees the activations it will see when serving), every product's input is sampled,
and its range is a percentile of those samples. Marian's int8 in Bergamot / Firefox Translations does the
same ("precomputed alphas"); a constant range is batch-invariant by construction.

The ranges are measured on encoder.onnx and decoder_step.onnx (plain sessions: the copying step takes the
cache as ordinary inputs) and carried to any other graph exported from the same weights
(decoder_inplace.onnx fuses q, k and v into one product) by the product's weights: two products whose
first weight columns are the same bytes read the same activation (`weight_key`).

Only real positions count: padding rows of the encoder and rows that already ended do not.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from export.quantize import products
from models.core.static_decode import pad_batch
from models.core.runtime import use_shared_pool

# The range clips the rarest 0.001% of each tail, chosen on validation data: both shipped models calibrated on
# Multi30k's first 500 validation sentences, greedy on the other 514, the percentile whose outputs stay closest
# to fp32's (BLEU within 0.5 for all): 99.999 kept 87.5% / 89.7% of them token-identical (en-de / en-fr; BLEU
# 35.33 / 45.55 against fp32's 35.48 / 45.63), 99.99 86.0% / 90.3%, the extremes 83.3% / 90.7%, 99.9 80.4% /
# 84.0%.
CALIBRATION_PERCENTILE = 99.999
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS_FOLDERS = {"multi30k": "multi30k", "tatoeba": "tatoeba-fra-eng"}
SAMPLES_PER_RUN = 4096  # values kept per activation per run (a random subset): percentiles read the pooled sample
KEY_COLUMNS = 8


def weight_key(w: np.ndarray) -> str:
    """The product's identity across graphs: its depth and its first KEY_COLUMNS weight columns (a fused q/k/v
    product starts with one of the three it fuses)."""
    head = np.ascontiguousarray(w[:, :KEY_COLUMNS], dtype=np.float32)
    return f"{w.shape[0]}:{hashlib.sha1(head.tobytes()).hexdigest()[:16]}"


@dataclass
class Samples:
    """A random subset of one activation's values at real positions, and its exact extremes."""
    lo: float = np.inf
    hi: float = -np.inf
    kept: list[np.ndarray] = field(default_factory=list)

    def add(self, values: np.ndarray, rng: np.random.Generator) -> None:
        if values.size == 0:
            return
        self.lo, self.hi = min(self.lo, float(values.min())), max(self.hi, float(values.max()))
        self.kept.append(values if values.size <= SAMPLES_PER_RUN else rng.choice(values, SAMPLES_PER_RUN))

    def range(self, percentile: float) -> tuple[float, float]:
        """(lo, hi): the extremes at 100, else the percentile's two tails of the sample; always spanning 0."""
        if percentile >= 100:
            lo, hi = self.lo, self.hi
        else:
            pooled = np.concatenate(self.kept)
            lo, hi = (float(v) for v in np.percentile(pooled, [100 - percentile, percentile]))
        return min(lo, 0.0), max(hi, 0.0)


class Recorder:
    """A session over a graph with every product input as an extra output, and the samples read from it."""

    def __init__(self, path: Path, seed: int = 0):
        model = onnx.load(str(path))
        self.keys: dict[str, list[str]] = {}  # activation -> the keys of the products that read it
        for node, w in products(model):
            self.keys.setdefault(node.input[0], []).append(weight_key(w))
        self.outputs = [o.name for o in model.graph.output]
        known = set(self.outputs)
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in self.keys
                                  if name not in known)
        options = ort.SessionOptions()
        options.use_per_session_threads = not use_shared_pool(0)  # a process with a shared pool refuses its own
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every named value
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        self.samples: dict[str, Samples] = {name: Samples() for name in self.keys}
        self.rng = np.random.default_rng(seed)

    def run(self, feeds: dict, real: np.ndarray) -> dict[str, np.ndarray]:
        """Run, sample every product input at the positions `real` marks (its shape: the activations' leading
        axes), and return the graph's own outputs."""
        values = dict(zip(self.names, self.session.run(None, feeds)))
        for name, sample in self.samples.items():
            x = values[name]
            sample.add(x.reshape(-1, x.shape[-1])[real.reshape(-1)].ravel(), self.rng)
        return {name: values[name] for name in self.outputs}

    def ranges(self, percentile: float) -> dict[str, tuple[float, float]]:
        """Each sampled activation's range by product key; one never sampled has none (ranges_for then names
        its products)."""
        return {key: self.samples[name].range(percentile) for name, keys in self.keys.items() if self.samples[name].kept
                for key in keys}


def measure(encoder: Path, decoder_step: Path, sources: Sequence[Sequence[int]], pad_id: int, bos_id: int,
            eos_id: int, percentile: float, batch: int = 32, max_len: int = 64) -> dict[str, tuple[float, float]]:
    """Ranges by weight key: greedy decoding of `sources` (token ids) through the fp32 graphs."""
    enc, dec = Recorder(encoder), Recorder(decoder_step)
    for start in range(0, len(sources), batch):
        src, mask = pad_batch(sources[start:start + batch], pad_id)
        width = src.shape[1]
        out = enc.run({"src_ids": src, "src_mask": mask}, mask)
        _greedy(dec, out["cross_k"], out["cross_v"], mask, bos_id, eos_id, min(max_len, 2 * width + 10))
    ranges = enc.ranges(percentile)
    ranges.update(dec.ranges(percentile))
    return ranges


def _greedy(dec: Recorder, cross_k: np.ndarray, cross_v: np.ndarray, src_mask: np.ndarray, bos_id: int,
            eos_id: int, max_len: int) -> None:
    """Greedy decoding through decoder_step.onnx, the past grown by concatenation (calibration only)."""
    layers, b, heads, _, head_dim = cross_k.shape
    past_k = np.zeros((layers, b, heads, 0, head_dim), np.float32)
    past_v = np.zeros_like(past_k)
    tokens = np.full((b, 1), bos_id, dtype=np.int64)
    running = np.ones(b, dtype=bool)
    for step in range(max_len):
        feeds = {"tokens": tokens, "positions": np.full((b, 1), step, dtype=np.int64), "past_k": past_k,
                 "past_v": past_v, "past_mask": np.ones((b, step), dtype=bool), "cross_k": cross_k,
                 "cross_v": cross_v, "src_mask": src_mask}
        out = dec.run(feeds, running[:, None])
        past_k = np.concatenate([past_k, out["new_k"]], axis=3)
        past_v = np.concatenate([past_v, out["new_v"]], axis=3)
        tokens = out["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        running &= tokens[:, 0] != eos_id
        if not running.any():
            break


def ranges_for(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]]) -> tuple[dict, list[str]]:
    """Each product input's range in `model` (activation -> (lo, hi)), and a problem for every product whose
    weights were not among those calibrated."""
    found, problems = {}, []
    for node, w in products(model):
        key = weight_key(w)
        if key in ranges:
            found[node.input[0]] = ranges[key]
        else:
            problems.append(f"{node.name or node.output[0]}: no calibrated range for its weights ({w.shape})")
    return found, problems


def default_calibration(meta: dict, src_lang: str, tgt_lang: str) -> tuple[str, list[str]] | None:
    """(where from, source sentences): the validation split of the corpus a checkpoint was trained on, where
    the project's data folder has it (calibration, like model selection, reads validation data only)."""
    folder = CORPUS_FOLDERS.get(meta.get("corpus", ""))
    if folder is None or not (DATA / folder).is_dir():
        return None
    from models.data import load_pairs

    try:
        pairs = load_pairs(meta["corpus"], "val", src_lang, tgt_lang, DATA / folder)
    except (OSError, ValueError):
        return None
    return f"{meta['corpus']} validation ({src_lang})", [p.src for p in pairs]


def encode_sources(lines: Iterable[str], encode, limit: int) -> list[list[int]]:
    """The first `limit` non-empty lines, normalised and tokenised."""
    from models.core.tokenizer import normalize

    kept = [line.strip() for line in lines if line.strip()][:limit]
    return [encode(normalize(line)) for line in kept]
