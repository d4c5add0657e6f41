"""The classic baseline: a bidirectional GRU encoder and a GRU decoder with additive attention.

    encode(src_ids, src_mask)          -> memory (B, S, 2He)          He = hidden_size / 2 per direction
    init_state(memory, src_mask)       -> GRUState (hidden, keys, memory, src_mask)
    decode_step(tokens, state)         -> logits (B, T, V), the state after the T tokens
    reorder_state(state, rows)         -> the state of rows[i] as row i (beam search)
    forward(src_ids, tgt_in)           -> teacher-forced logits (B, T, V)

Bahdanau et al. (2015), with the choices of its later tutorial-grade
descendants (Nematus, Luong's "input feeding" relatives): the attention query
is the decoder state *before* the step, the context joins the embedding as the
GRU input, and a deep output layer tanh(W [s; c; emb]) feeds an output matrix
tied to the embedding table (as the Transformer ties its tables, so parameter
counts compare on equal terms). There are no positions, so the model has no
length limit of its own; `max_positions` only bounds search and training data
exactly as it does for the Transformer.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from models.core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID


@dataclass
class GRUConfig:
    vocab_size: int = 8000
    emb_dim: int = 256
    hidden_size: int = 512  # decoder state; the encoder runs hidden_size / 2 per direction
    enc_layers: int = 2
    dec_layers: int = 1
    dropout: float = 0.3
    max_positions: int = 512  # a search / data bound only (see the module docstring)
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __post_init__(self) -> None:
        problems = []
        if self.hidden_size % 2:
            problems.append(f"hidden_size={self.hidden_size} must be even (two encoder directions)")
        if min(self.enc_layers, self.dec_layers, self.emb_dim) < 1:
            problems.append("enc_layers, dec_layers and emb_dim must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout={self.dropout} must be in [0, 1)")
        if max(self.pad_id, self.bos_id, self.eos_id, self.unk_id) >= self.vocab_size:
            problems.append(f"special ids must be < vocab_size={self.vocab_size}")
        if problems:
            raise ValueError("invalid GRUConfig: " + "; ".join(problems))

    @property
    def out_vocab_size(self) -> int:
        return self.vocab_size  # one joint vocabulary, as in the Transformer presets

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GRUConfig":
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown GRUConfig fields: {unknown}")
        return cls(**data)


GRU_PRESETS: dict[str, dict[str, Any]] = {
    # For unit tests: learns a handful of sentences in a few hundred steps.
    "tiny": dict(emb_dim=32, hidden_size=64, enc_layers=1, dec_layers=1, dropout=0.0, max_positions=128),
    # Sized to the Transformer's `small` (~7.6M parameters with 8000 pieces): the comparison is per parameter.
    "small": dict(emb_dim=256, hidden_size=512, enc_layers=2, dec_layers=1, dropout=0.3),
}


def gru_preset(name: str, **overrides: Any) -> GRUConfig:
    if name not in GRU_PRESETS:
        raise KeyError(f"unknown GRU preset {name!r}; choose from {sorted(GRU_PRESETS)}")
    return GRUConfig(**{**GRU_PRESETS[name], **overrides})


class GRUState(NamedTuple):
    """Everything a decoder step needs; every tensor has the batch on the axis named B."""
    hidden: Tensor  # (L, B, D) decoder GRU states after the last consumed token
    keys: Tensor  # (B, S, D) W_k memory: projected once per sentence, not once per step
    memory: Tensor  # (B, S, 2He) the attention values
    src_mask: Tensor  # (B, S) bool, True on real source tokens


def gru_cell(x_gates: Tensor, h: Tensor, cell: nn.GRUCell) -> Tensor:
    """One GRU update from precomputed input gates x_gates = W_ih x + b_ih (B, 3D) and h (B, D).

    Written out instead of calling `cell(x, h)` for two reasons: the input half
    of the gates is computed for all T tokens at once outside the loop, and the
    state update runs in fp32 even under bf16 autocast, because a recurrent
    state rounded to bf16 at every step loses precision with sentence length.
    """
    h_gates = F.linear(h, cell.weight_hh, cell.bias_hh).float()  # (B, 3D)
    xr, xz, xn = x_gates.float().chunk(3, dim=-1)
    hr, hz, hn = h_gates.chunk(3, dim=-1)
    r = torch.sigmoid(xr + hr)
    z = torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h.float()  # (B, D)


class GRUSeq2Seq(nn.Module):
    def __init__(self, cfg: GRUConfig):
        super().__init__()
        self.cfg = cfg
        e, d = cfg.emb_dim, cfg.hidden_size
        self.embed = nn.Embedding(cfg.vocab_size, e, padding_idx=cfg.pad_id)  # source, target and output
        self.encoder = nn.GRU(e, d // 2, num_layers=cfg.enc_layers, batch_first=True, bidirectional=True,
                              dropout=cfg.dropout if cfg.enc_layers > 1 else 0.0)
        self.bridge = nn.Linear(d, cfg.dec_layers * d)  # [final fwd; final bwd] -> every decoder layer's s_0
        self.attn_q = nn.Linear(d, d, bias=False)  # W_q
        self.attn_k = nn.Linear(d, d)  # W_k (its bias is the only bias inside the tanh)
        self.attn_v = nn.Linear(d, 1, bias=False)  # v
        # Layer 0 reads [embedding; context]; higher layers read the layer below.
        self.cells = nn.ModuleList(nn.GRUCell(e + d if i == 0 else d, d) for i in range(cfg.dec_layers))
        self.readout = nn.Linear(d + d + e, e)  # deep output over [s_i; c_i; emb_i]
        self.out_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.dropout = nn.Dropout(cfg.dropout)
        nn.init.normal_(self.embed.weight, std=e ** -0.5)  # unit-scale rows keep the tied logits small at start
        with torch.no_grad():
            self.embed.weight[cfg.pad_id].zero_()

    # -- encoder --------------------------------------------------------------
    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids (B, S) int, src_mask (B, S) bool (right padding) -> memory (B, S, D), zeros at pads."""
        lengths = src_mask.sum(dim=1).cpu()  # (B,) pack_padded_sequence wants them on the CPU
        if bool((lengths == 0).any()):
            raise ValueError("every source row needs at least one real token (the EOS)")
        x = self.dropout(self.embed(src_ids))  # (B, S, E)
        # Packing runs each row only over its own tokens, so the backward direction starts at the
        # row's last real token and pads never reach a state: a sentence encodes the same alone or batched.
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src_ids.size(1))
        return memory  # (B, S, D)

    # -- decoder --------------------------------------------------------------
    def init_state(self, memory: Tensor, src_mask: Tensor) -> GRUState:
        """memory (B, S, D), src_mask (B, S) -> the state before the first (BOS) step."""
        b, _, d = memory.shape
        last = src_mask.sum(dim=1) - 1  # (B,) index of each row's last real token
        fwd = memory[torch.arange(b, device=memory.device), last, : d // 2]  # (B, D/2) forward final state
        bwd = memory[:, 0, d // 2:]  # (B, D/2) backward final state (it ends at position 0)
        hidden = torch.tanh(self.bridge(torch.cat([fwd, bwd], dim=-1)))  # (B, L*D)
        hidden = hidden.view(b, self.cfg.dec_layers, d).transpose(0, 1).contiguous()  # (L, B, D)
        return GRUState(hidden, self.attn_k(memory), memory, src_mask)

    def attend(self, query: Tensor, state: GRUState) -> Tensor:
        """query (B, D) -> context (B, D): sum_j softmax_j(v^T tanh(W_q q + W_k h_j)) h_j."""
        energy = torch.tanh(state.keys + self.attn_q(query)[:, None, :])  # (B, S, D)
        scores = self.attn_v(energy).squeeze(-1).float()  # (B, S)
        # -inf gives pads exactly zero weight; encode() guarantees every row has a real token.
        scores = scores.masked_fill(~state.src_mask, float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, S)
        return torch.bmm(weights[:, None, :].to(state.memory.dtype), state.memory).squeeze(1)  # (B, D)

    def decode_step(self, tokens: Tensor, state: GRUState) -> tuple[Tensor, GRUState]:
        """tokens (B, T) int consumed in order -> logits (B, T, V) and the state after them.

        Training calls it once with the whole shifted target, search with one
        token per row; both run the same per-token recurrence, so their logits agree.
        """
        emb = self.dropout(self.embed(tokens))  # (B, T, E)
        cell0 = self.cells[0]
        e = self.cfg.emb_dim
        # The embedding's share of layer 0's input gates, for all T tokens in one matmul.
        emb_gates = F.linear(emb, cell0.weight_ih[:, :e], cell0.bias_ih)  # (B, T, 3D)
        hidden = list(state.hidden.unbind(0))  # L x (B, D)
        tops, contexts = [], []
        for t in range(tokens.size(1)):
            # Bahdanau: the query is the state before this token, so the context can feed the GRU input.
            context = self.attend(hidden[-1], state)  # (B, D)
            x_gates = emb_gates[:, t] + F.linear(context, cell0.weight_ih[:, e:])  # (B, 3D)
            hidden[0] = gru_cell(x_gates, hidden[0], cell0)
            for i in range(1, len(self.cells)):
                below = self.dropout(hidden[i - 1])
                cell = self.cells[i]
                hidden[i] = gru_cell(F.linear(below, cell.weight_ih, cell.bias_ih), hidden[i], cell)
            tops.append(hidden[-1])
            contexts.append(context)
        top = torch.stack(tops, dim=1)  # (B, T, D)
        ctx = torch.stack(contexts, dim=1).to(top.dtype)  # (B, T, D)
        # The output layer sees all T tokens at once: the vocabulary matmul, the costliest op, leaves the loop.
        out = torch.tanh(self.readout(self.dropout(torch.cat([top, ctx, emb], dim=-1))))  # (B, T, E)
        logits = F.linear(self.dropout(out), self.embed.weight) + self.out_bias  # (B, T, V)
        return logits, state._replace(hidden=torch.stack(hidden))

    @staticmethod
    def reorder_state(state: GRUState, rows: Tensor) -> GRUState:
        """Keep row rows[i] as row i: beam search's parents, and its initial copy of each sentence K times."""
        return GRUState(state.hidden.index_select(1, rows), state.keys.index_select(0, rows),
                        state.memory.index_select(0, rows), state.src_mask.index_select(0, rows))

    # -- training -------------------------------------------------------------
    def forward(self, src_ids: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for right-padded src_ids (B, S) and tgt_in (B, T)."""
        src_mask = src_ids != self.cfg.pad_id
        state = self.init_state(self.encode(src_ids, src_mask), src_mask)
        logits, _ = self.decode_step(tgt_in, state)
        return logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
