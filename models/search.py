"""Greedy and beam search in PyTorch over the model's encode / decode_step API.

This is the reference the ONNX Runtime decoder (export/) and the serving
engine are checked against, token for token. The KV cache is preallocated
per call (gpt-fast style) and written in place one step at a time.

The search loops see a model only through a decoder session (`open_session`):
`step(tokens)` feeds one token per row and returns the next-token logits,
`reorder(rows)` keeps row rows[i] as row i. The Transformer's session wraps
its KV cache here; a model with its own recurrent state (models/gru.py)
provides `init_state`, `decode_step(tokens, state)` and `reorder_state`.
"""
from __future__ import annotations

from typing import Any, Protocol, Union

import torch
from torch import Tensor

from models.core.beam import Hypothesis  # the one Hypothesis type (tokens, score, finished_by_eos)
from models.core.config import max_output_len
from models.transformer import Transformer


class StatefulModel(Protocol):
    """The search interface of a model that carries its decoder state itself (models/gru.py)."""
    cfg: Any

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor: ...
    def init_state(self, memory: Tensor, src_mask: Tensor) -> Any: ...
    def decode_step(self, tokens: Tensor, state: Any) -> tuple[Tensor, Any]: ...
    def reorder_state(self, state: Any, rows: Tensor) -> Any: ...


SearchModel = Union[Transformer, StatefulModel]


class KVCache:
    """Self-attention keys/values for every layer, preallocated to `capacity` steps."""

    def __init__(self, model: Transformer, rows: int, capacity: int, device=None):
        cfg = model.cfg
        shape = (cfg.n_dec_layers, rows, cfg.n_heads, capacity, cfg.head_dim)  # (L, B, H, Tmax, Dh)
        self.k = torch.zeros(shape, device=device)
        self.v = torch.zeros(shape, device=device)
        self.length = 0

    def past(self) -> tuple[Tensor, Tensor]:
        return self.k[:, :, :, : self.length], self.v[:, :, :, : self.length]

    def append(self, new_k: Tensor, new_v: Tensor) -> None:
        """new_k, new_v (L, B, H, 1, Dh) written at the next free position."""
        self.k[:, :, :, self.length : self.length + 1] = new_k
        self.v[:, :, :, self.length : self.length + 1] = new_v
        self.length += 1

    def reorder(self, rows: Tensor) -> None:
        """Keep row rows[i] as row i (beam search parents)."""
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)


class TransformerSession:
    """The Transformer's decoder state for one search: cross keys/values, source mask, KV cache.

    use_cache=False keeps the fed tokens instead and recomputes the whole
    prefix every step (the tutorials' way: the parity baseline).
    """

    def __init__(self, model: Transformer, src_ids: Tensor, capacity: int, use_cache: bool = True):
        self.model = model
        self.src_mask = src_ids != model.cfg.pad_id  # (R, S)
        self.cross_k, self.cross_v = model.cross_kv(model.encode(src_ids, self.src_mask))  # (L, R, H, S, Dh)
        rows = src_ids.size(0)
        self.cache = KVCache(model, rows, capacity, src_ids.device) if use_cache else None
        self.prefix = torch.zeros(rows, 0, dtype=torch.long, device=src_ids.device)  # (R, t) fed so far
        self.steps = 0

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (R, 1) -> logits of the next token (R, V)."""
        rows, dev, model = tokens.size(0), tokens.device, self.model
        if self.cache is not None:
            past_k, past_v = self.cache.past()
            past_mask = torch.ones(rows, self.steps, dtype=torch.bool, device=dev)
            positions = torch.full((rows, 1), self.steps, dtype=torch.long, device=dev)
        else:
            past_k, past_v, past_mask = model.empty_past(rows, dev)
            self.prefix = torch.cat([self.prefix, tokens], dim=1)
            tokens = self.prefix
            positions = torch.arange(self.steps + 1, device=dev).expand(rows, self.steps + 1)
        logits, new_k, new_v = model.decode_step(tokens, positions, past_k, past_v, past_mask,
                                                 self.cross_k, self.cross_v, self.src_mask)
        if self.cache is not None:
            self.cache.append(new_k, new_v)
        self.steps += 1
        return logits[:, -1]

    def reorder(self, rows: Tensor) -> None:
        self.cross_k, self.cross_v = self.cross_k.index_select(1, rows), self.cross_v.index_select(1, rows)
        self.src_mask = self.src_mask.index_select(0, rows)
        self.prefix = self.prefix.index_select(0, rows)
        if self.cache is not None:
            self.cache.reorder(rows)


class StatefulSession:
    """The same two calls over a model that carries its own decoder state (StatefulModel)."""

    def __init__(self, model: StatefulModel, src_ids: Tensor, use_cache: bool = True):
        self.model = model
        src_mask = src_ids != model.cfg.pad_id
        self.state = model.init_state(model.encode(src_ids, src_mask), src_mask)
        self.initial = None if use_cache else self.state  # recompute mode restarts from here every step
        self.prefix = torch.zeros(src_ids.size(0), 0, dtype=torch.long, device=src_ids.device)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens (R, 1) -> logits of the next token (R, V)."""
        if self.initial is None:
            logits, self.state = self.model.decode_step(tokens, self.state)
        else:
            self.prefix = torch.cat([self.prefix, tokens], dim=1)
            logits, _ = self.model.decode_step(self.prefix, self.initial)
        return logits[:, -1]

    def reorder(self, rows: Tensor) -> None:
        self.state = self.model.reorder_state(self.state, rows)
        self.prefix = self.prefix.index_select(0, rows)
        if self.initial is not None:
            self.initial = self.model.reorder_state(self.initial, rows)


def open_session(model: SearchModel, src_ids: Tensor, capacity: int,
                 use_cache: bool = True) -> Union[TransformerSession, StatefulSession]:
    """A decoder session over right-padded src_ids (R, S) for at most `capacity` steps."""
    if hasattr(model, "init_state"):
        return StatefulSession(model, src_ids, use_cache)
    return TransformerSession(model, src_ids, capacity, use_cache)


@torch.no_grad()
def greedy(model: SearchModel, src_ids: Tensor, max_len: int | None = None, use_cache: bool = True,
           min_len: int = 0) -> list[list[int]]:
    """Batched greedy decoding. src_ids (B, S) right-padded. Returns ids without BOS/EOS.

    use_cache=False recomputes the whole prefix each step (the tutorials' way);
    it exists as the parity baseline and for benchmarks. EOS is suppressed for
    the first `min_len` steps (min_len = max_len forces exact lengths).
    """
    cfg = model.cfg
    b, s = src_ids.shape
    max_len = max_len or max_output_len(s, cfg.max_positions - 1)
    session = open_session(model, src_ids, max_len, use_cache)
    prefix = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src_ids.device)
    finished = torch.zeros(b, dtype=torch.bool, device=src_ids.device)
    for step in range(max_len):
        last = session.step(prefix[:, -1:])  # (B, V)
        if step < min_len:
            last = last.index_fill(1, torch.tensor([cfg.eos_id], device=last.device), float("-inf"))
        nxt = last.argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, cfg.pad_id), nxt)
        prefix = torch.cat([prefix, nxt[:, None]], dim=1)
        finished |= nxt == cfg.eos_id
        if bool(finished.all()):
            break
    return [_strip(row, cfg.eos_id, cfg.pad_id) for row in prefix[:, 1:].tolist()]


def _strip(ids: list[int], eos: int, pad: int) -> list[int]:
    out = []
    for t in ids:
        if t == eos or t == pad:
            break
        out.append(t)
    return out


def length_normalized(score: float, length: int, alpha: float) -> float:
    """Log-prob divided by length^alpha; length counts the EOS token."""
    return score / (max(length, 1) ** alpha)


@torch.no_grad()
def beam_search(model: SearchModel, src_ids: Tensor, beam: int = 5, alpha: float = 1.0,
                max_len: int | None = None, n_best: int = 1) -> list[list[Hypothesis]]:
    """Batched beam search; returns the n_best finished hypotheses per sentence, best first.

    Each step ranks the top 2*beam continuations per sentence; an EOS among the
    first `beam` of them finishes a hypothesis, the best `beam` non-EOS ones
    live on. A sentence stops once it holds `beam` finished hypotheses; at
    max_len the live beams are finished as they stand.
    """
    cfg = model.cfg
    b, s = src_ids.shape
    k = beam
    max_len = max_len or max_output_len(s, cfg.max_positions - 1)
    dev = src_ids.device
    session = open_session(model, src_ids, max_len)
    session.reorder(torch.arange(b, device=dev).repeat_interleave(k))  # (B*K,) rows: K copies of each sentence
    scores = torch.full((b, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # only the first beam is live at step 0, so no duplicates
    tokens = torch.full((b * k,), cfg.bos_id, dtype=torch.long, device=dev)
    history = torch.zeros(b * k, 0, dtype=torch.long, device=dev)
    done: list[list[Hypothesis]] = [[] for _ in range(b)]
    active = [True] * b
    vocab = cfg.vocab_size
    for step in range(max_len):
        logp = session.step(tokens[:, None]).float().log_softmax(-1).view(b, k, vocab)
        cand = (scores[:, :, None] + logp).view(b, k * vocab)  # (B, K*V)
        top_scores, top_idx = cand.topk(2 * k, dim=1)  # (B, 2K)
        last = step == max_len - 1
        next_scores = torch.full((b, k), float("-inf"), device=dev)
        parents = torch.zeros(b, k, dtype=torch.long, device=dev)
        next_tokens = torch.full((b, k), cfg.pad_id, dtype=torch.long, device=dev)
        ts, ti = top_scores.tolist(), top_idx.tolist()
        for i in range(b):
            if not active[i]:
                continue
            filled = 0
            for rank, (sc, idx) in enumerate(zip(ts[i], ti[i])):
                if sc == float("-inf"):
                    break
                parent, tok = divmod(idx, vocab)
                if tok == cfg.eos_id or last:
                    # Like fairseq, an EOS counts only when it ranks among the top `beam`
                    # candidates: a low-probability early stop must not fill the
                    # finished list before the live beams get there.
                    if rank < k and len(done[i]) < k:
                        seq = history[i * k + parent].tolist() + ([] if tok == cfg.eos_id else [tok])
                        done[i].append(Hypothesis(seq, length_normalized(sc, step + 1, alpha)))
                    continue
                if filled < k:
                    next_scores[i, filled], parents[i, filled], next_tokens[i, filled] = sc, parent, tok
                    filled += 1
            if len(done[i]) >= k or last:
                active[i] = False
        if not any(active):
            break
        flat_parents = (torch.arange(b, device=dev)[:, None] * k + parents).view(-1)  # (B*K,)
        session.reorder(flat_parents)
        tokens = next_tokens.view(-1)
        history = torch.cat([history.index_select(0, flat_parents), tokens[:, None]], dim=1)
        scores = next_scores
    return [sorted(h, key=lambda x: -x.score)[:n_best] for h in done]
