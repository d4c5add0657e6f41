"""Parity between the PyTorch model and its ONNX graphs.

Three levels:
  * `graph_parity`: every output of both graphs on random batches with padding,
    ragged positions and holes in the past, max abs diff against PyTorch.
  * `inplace_parity`: decoder_inplace.onnx on slot buffers with rows of
    different ages and source lengths (garbage past each row's length) against
    the model's own decode_step on each row's real entries alone.
  * `token_parity`: whole decodes (greedy or beam) through ONNX Runtime + numpy
    against models/search.py, sentence by sentence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch

from export import inplace
from export.onnx import example_inputs
from models import search as torch_search
from models.core import static_decode
from models.core.runtime import OnnxModel
from models.transformer import Transformer

# (batch, src_len, past_len, step): includes an empty past, a single row, one source token, T > 1.
PARITY_CASES = [(2, 5, 3, 1), (3, 9, 0, 1), (1, 1, 7, 1), (4, 13, 11, 1), (3, 6, 4, 3)]


@dataclass
class GraphDiff:
    case: tuple[int, int, int, int]
    output: str
    max_abs_diff: float


def graph_parity(model: Transformer, onnx_model: OnnxModel,
                 cases: Sequence[tuple[int, int, int, int]] = PARITY_CASES) -> list[GraphDiff]:
    """Max abs diff per output and case (encoder: memory/cross_k/cross_v; decoder: logits/new_k/new_v)."""
    model = model.eval()
    diffs = []
    for seed, case in enumerate(cases):
        b, s, p, t = case
        (src_ids, src_mask), dec = example_inputs(model, b, s, p, t, seed=seed)
        with torch.no_grad():
            memory = model.encode(src_ids, src_mask)
            want_enc = (memory, *model.cross_kv(memory))
            want_dec = model.decode_step(*dec)
        got_enc = onnx_model.encode(src_ids.numpy(), src_mask.numpy())
        got_dec = onnx_model.decode_step(*(x.numpy() for x in dec))
        for name, got, want in zip(("memory", "cross_k", "cross_v"), got_enc, want_enc):
            diffs.append(GraphDiff(case, name, float(np.abs(got - want.numpy()).max())))
        for name, got, want in zip(("logits", "new_k", "new_v"), got_dec, want_dec):
            diffs.append(GraphDiff(case, name, float(np.abs(got - want.numpy()).max())))
    return diffs


# (rows, capacity, src_capacity): ages and source lengths include 0 / 1 and the last position.
INPLACE_CASES = [(3, 8, 6), (1, 2, 2), (5, 17, 9)]


# Fed plain arrays, the standard-op graph's TensorScatter warns that it copies instead of writing in place
# (the engine binds past and present to one buffer; tests/integration/test_inplace.py): expected here.
QUIET = ort.RunOptions()
QUIET.log_severity_level = 3


def inplace_parity(model: Transformer, session, cases=INPLACE_CASES) -> list[GraphDiff]:
    """Max abs diff of logits, and of the new self-attention entries at each row's own position.

    `session` is an onnxruntime.InferenceSession of decoder_inplace.onnx, fed plain arrays
    (present is then a fresh tensor; the engine's aliasing is tested through the server).
    """
    model = model.eval()
    layers = model.cfg.n_dec_layers
    names = inplace.io_names(layers)[0]
    diffs = []
    for seed, (b, cap, src_cap) in enumerate(cases):
        feeds = inplace.example_inputs(model, b, cap, src_cap, seed=seed)
        tokens, positions, _, src_len, *caches = feeds
        got = session.run(None, {n: x.numpy() for n, x in zip(names, feeds)}, QUIET)
        out = dict(zip((o.name for o in session.get_outputs()), got))  # GQA's graph and the standard-op one
        worst = {"logits": 0.0, "present_key": 0.0, "present_value": 0.0}
        for r in range(b):
            n, s = int(positions[r, 0]), int(src_len[r])
            # The row's real entries alone, stacked over layers: (L, 1, H, n or s, Dh).
            past_k, past_v, cross_k, cross_v = (torch.stack([caches[4 * i + kind][r:r + 1, :, :m] for i in range(layers)])
                                                for kind, m in ((0, n), (1, n), (2, s), (3, s)))
            with torch.no_grad():
                logits, new_k, new_v = model.decode_step(
                    tokens[r:r + 1], positions[r:r + 1], past_k, past_v, torch.ones(1, n, dtype=torch.bool),
                    cross_k, cross_v, torch.ones(1, s, dtype=torch.bool))
            # (V,) from graphs since 2026-11-29, (1, V) before: the row's logits either way
            row = out["logits"][r].reshape(-1)
            worst["logits"] = max(worst["logits"], float(np.abs(row - logits[0, -1].numpy()).max()))
            for i in range(layers):
                for kind, new in (("present_key", new_k), ("present_value", new_v)):
                    entry = out[f"{kind}_{i}"][r, :, n]  # (H, Dh) written at the row's own position
                    worst[kind] = max(worst[kind], float(np.abs(entry - new[i, 0, :, 0].numpy()).max()))
        diffs += [GraphDiff((b, cap, src_cap, 1), name, value) for name, value in worst.items()]
    return diffs


@dataclass
class TokenParity:
    sentences: int
    identical: int
    torch_ids: list[list[int]]
    onnx_ids: list[list[int]]

    @property
    def ratio(self) -> float:
        return self.identical / max(self.sentences, 1)


def token_parity(model: Transformer, onnx_model: OnnxModel, sources: Sequence[Sequence[int]],
                 beam: int = 1, alpha: float = 1.0, batch_size: int = 32,
                 torch_ids: list[list[int]] | None = None) -> TokenParity:
    """Decode `sources` (ids with EOS) both ways in the same batches; count identical outputs.

    `torch_ids` from an earlier call with the same sources and settings skips the PyTorch side.
    """
    pad = model.cfg.pad_id
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    t_out: list[list[int]] = [[] for _ in sources]
    o_out: list[list[int]] = [[] for _ in sources]
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ids, mask = static_decode.pad_batch([sources[i] for i in chunk], pad)
        src = torch.from_numpy(ids)
        if torch_ids is not None:
            t_res = [torch_ids[i] for i in chunk]
        elif beam <= 1:
            t_res = torch_search.greedy(model, src)
        else:
            t_res = [h[0].tokens for h in torch_search.beam_search(model, src, beam=beam, alpha=alpha)]
        if beam <= 1:
            o_res = static_decode.greedy(onnx_model, ids, mask)
        else:
            o_res = [h[0].tokens for h in static_decode.beam_search(onnx_model, ids, mask, beam=beam, alpha=alpha)]
        for i, a, b in zip(chunk, t_res, o_res):
            t_out[i], o_out[i] = a, b
    same = sum(a == b for a, b in zip(t_out, o_out))
    return TokenParity(len(sources), same, t_out, o_out)


@dataclass
class Difference:
    index: int  # which source
    gap: float  # greedy: top-2 logit gap at the first differing position; beam: |score a - score b|


def near_ties(model: Transformer, sources: Sequence[Sequence[int]], a_ids: Sequence[Sequence[int]],
              b_ids: Sequence[Sequence[int]], beam: int = 1, alpha: float = 1.0) -> list[Difference]:
    """Why two decodes of the same sources differ, judged by the PyTorch model (the reference).

    Greedy: teacher-forced on the common prefix, the gap between the two best logits where the
    outputs part; a float-noise tie has a gap near 0, a wrong graph a large one. Beam: the two
    final hypotheses' length-normalised scores (log-probability / (length + EOS)^alpha); the
    search may pick either of two hypotheses that score the same."""
    model = model.eval()
    out = []
    for i, (src, a, b) in enumerate(zip(sources, a_ids, b_ids)):
        a, b = list(a), list(b)
        if a == b:
            continue
        if beam <= 1:
            k = next(j for j in range(min(len(a), len(b)) + 1) if j == min(len(a), len(b)) or a[j] != b[j])
            logits = _teacher_forced(model, src, a[:k])[-1]
            top2 = torch.topk(logits, 2).values
            out.append(Difference(i, float(top2[0] - top2[1])))
        else:
            sa, sb = (_normalised_score(model, src, ids, alpha) for ids in (a, b))
            out.append(Difference(i, abs(sa - sb)))
    return out


def _teacher_forced(model: Transformer, src: Sequence[int], ids: list[int]) -> torch.Tensor:
    """Logits (T + 1, V) after BOS + ids for one source."""
    cfg = model.cfg
    src_ids = torch.tensor([list(src)])
    src_mask = torch.ones_like(src_ids, dtype=torch.bool)
    prefix = torch.tensor([[cfg.bos_id] + ids])
    past_k, past_v, past_mask = model.empty_past(1)
    with torch.no_grad():
        cross_k, cross_v = model.cross_kv(model.encode(src_ids, src_mask))
        logits, _, _ = model.decode_step(prefix, torch.arange(prefix.shape[1])[None], past_k, past_v, past_mask,
                                         cross_k, cross_v, src_mask)
    return logits[0]


def _normalised_score(model: Transformer, src: Sequence[int], ids: list[int], alpha: float) -> float:
    target = ids + [model.cfg.eos_id]
    logp = torch.log_softmax(_teacher_forced(model, src, ids).double(), dim=-1)
    total = float(logp[torch.arange(len(target)), torch.tensor(target)].sum())
    return total / len(target) ** alpha
