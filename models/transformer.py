"""The encoder-decoder Transformer: pure math, split by phase.

    encode(src_ids, src_mask)                      -> memory            (B, S, D)
    cross_kv(memory)                               -> cross_k, cross_v  (L, B, H, S, Dh)
    decode_step(tokens, positions, past_k, past_v, past_mask,
                cross_k, cross_v, src_mask)        -> logits (B, T, V), new_k, new_v (L, B, H, T, Dh)

`decode_step` is the only decoder entry point: training calls it with the
whole shifted target and an empty past (T = target length, P = 0), the
incremental path with one token per row and the cache as the past. Rows may
sit at different positions (`positions` is per row) and have different
amounts of valid past (`past_mask`), which is what a continuous-batching
engine needs. The per-layer keys/values are stacked on a leading L axis so an
exported graph has one past input and one present output per kind.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import MultiHeadAttention, causal_mask, local_window_mask
from models.core.config import ModelConfig


def sinusoidal_table(positions: Tensor, d_model: int, freq_shift: int = 0) -> Tensor:
    """positions (...) int -> (..., D) float: [sin(p w_i) for i] ++ [cos(p w_i) for i].

    w_i = 10000^(-i / (D/2 - freq_shift)): freq_shift 0 is 10000^(-2i/D) (this
    repo, Marian), 1 is fairseq's table (M2M100, NLLB). The concatenated (not
    interleaved) layout is written down because the CTranslate2 converter and
    Hugging Face's Marian/M2M100 use this exact table.
    """
    half = d_model // 2
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float32, device=positions.device)
                         * (-math.log(10000.0) / (half - freq_shift)))  # (D/2,)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (..., D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., D)


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, cfg.attention)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if self.pre_norm:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, x, mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, cfg.attention)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, cfg.attention)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, past_k: Tensor, past_v: Tensor, self_mask: Tensor,
                cross_k: Tensor, cross_v: Tensor, cross_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D); past (B, H, P, Dh); returns x and this step's k, v (B, H, T, Dh)."""
        h = self.norm1(x) if self.pre_norm else x
        new_k, new_v = self.self_attn.project_kv(h)
        k = torch.cat([past_k, new_k], dim=2)  # (B, H, P+T, Dh)
        v = torch.cat([past_v, new_v], dim=2)
        a = self.self_attn.attend(h, k, v, self_mask)
        x = x + self.dropout(a) if self.pre_norm else self.norm1(x + self.dropout(a))

        h = self.norm2(x) if self.pre_norm else x
        a = self.cross_attn.attend(h, cross_k, cross_v, cross_mask)
        x = x + self.dropout(a) if self.pre_norm else self.norm2(x + self.dropout(a))

        h = self.norm3(x) if self.pre_norm else x
        a = self.ffn(h)
        x = x + self.dropout(a) if self.pre_norm else self.norm3(x + self.dropout(a))
        return x, new_k, new_v


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.tgt_embed = self.embed if cfg.tie_embeddings else nn.Embedding(
            cfg.out_vocab_size, cfg.d_model, padding_idx=cfg.pad_id if cfg.pad_id < cfg.out_vocab_size else None)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
        eps = cfg.layer_norm_eps
        self.enc_norm = nn.LayerNorm(cfg.d_model, eps=eps) if cfg.final_norms else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model, eps=eps) if cfg.final_norms else nn.Identity()
        self.out_proj = None if cfg.tie_output else nn.Linear(cfg.d_model, cfg.out_vocab_size, bias=False)
        # A constant, like Hugging Face's buffer of the same name; only imported models have one.
        self.register_buffer("final_logits_bias", torch.zeros(cfg.out_vocab_size) if cfg.output_bias else None)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.dropout = nn.Dropout(cfg.dropout)
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        for emb in {self.embed, self.tgt_embed}:
            # Embeddings are scaled by sqrt(D) on the way in, so N(0, 1/D) keeps
            # their contribution at unit scale and the tied output logits small.
            nn.init.normal_(emb.weight, std=self.cfg.d_model ** -0.5)
            if emb.padding_idx is not None:
                with torch.no_grad():
                    emb.weight[emb.padding_idx].zero_()

    def _embed(self, table: nn.Embedding, ids: Tensor, positions: Tensor) -> Tensor:
        """ids, positions (B, T) -> (B, T, D); positions count from 0, the table's offset is added here."""
        cfg = self.cfg
        x = table(ids) * self.embed_scale + sinusoidal_table(positions + cfg.position_offset, cfg.d_model,
                                                             cfg.position_freq_shift)
        return self.dropout(x)  # (B, T, D)

    # -- encoder --------------------------------------------------------------
    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids (B, S) int, src_mask (B, S) bool -> memory (B, S, D)."""
        b, s = src_ids.shape
        positions = torch.arange(s, device=src_ids.device).expand(b, s)
        x = self._embed(self.embed, src_ids, positions)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        if self.cfg.local_window is not None:
            mask = mask & local_window_mask(s, self.cfg.local_window, src_ids.device)  # (B, 1, S, S)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x)

    def cross_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory (B, S, D) -> cross keys, values (L, B, H, S, Dh), computed once per sequence."""
        ks, vs = zip(*(layer.cross_attn.project_kv(memory) for layer in self.decoder))
        return torch.stack(ks), torch.stack(vs)

    # -- decoder --------------------------------------------------------------
    def empty_past(self, batch: int, device: Optional[torch.device] = None) -> tuple[Tensor, Tensor, Tensor]:
        """A zero-length past: k, v (L, B, H, 0, Dh) and past_mask (B, 0)."""
        cfg = self.cfg
        shape = (cfg.n_dec_layers, batch, cfg.n_heads, 0, cfg.head_dim)
        return (torch.zeros(shape, device=device), torch.zeros(shape, device=device),
                torch.zeros(batch, 0, dtype=torch.bool, device=device))

    def decode_step(self, tokens: Tensor, positions: Tensor, past_k: Tensor, past_v: Tensor,
                    past_mask: Tensor, cross_k: Tensor, cross_v: Tensor,
                    src_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One decoder pass over T new tokens per row.

        tokens, positions (B, T) int; past_k, past_v (L, B, H, P, Dh); past_mask (B, P) bool;
        cross_k, cross_v (L, B, H, S, Dh); src_mask (B, S) bool.
        Returns logits (B, T, V) and the new tokens' keys/values (L, B, H, T, Dh).
        """
        b, t = tokens.shape
        x = self._embed(self.tgt_embed, tokens, positions)  # (B, T, D)
        past = past_mask[:, None, None, :].expand(b, 1, t, past_mask.size(1))  # (B, 1, T, P)
        step = causal_mask(t, tokens.device).expand(b, 1, t, t)  # (B, 1, T, T)
        self_mask = torch.cat([past, step], dim=-1)  # (B, 1, T, P+T)
        cross_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        new_ks, new_vs = [], []
        for i, layer in enumerate(self.decoder):
            x, k, v = layer(x, past_k[i], past_v[i], self_mask, cross_k[i], cross_v[i], cross_mask)
            new_ks.append(k)
            new_vs.append(v)
        return self.logits(x), torch.stack(new_ks), torch.stack(new_vs)

    def logits(self, x: Tensor) -> Tensor:
        """The last decoder layer's output (B, T, D) -> logits (B, T, V)."""
        b, t, _ = x.shape
        x = self.dec_norm(x)
        if self.out_proj is None:
            # 2-D so the ONNX exporter emits Gemm(transB=1) on the embedding itself
            # instead of constant-folding a transposed copy of it into the graph.
            logits = F.linear(x.reshape(b * t, -1), self.tgt_embed.weight).view(b, t, -1)  # (B, T, V)
        else:
            logits = self.out_proj(x)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

    def logits_rows(self, x: Tensor) -> Tensor:
        """Rows of the last decoder layer's output (N, D) -> the projection (N, V) before final_logits_bias,
        for the in-place step's 2-D rows. export/inplace.py adds the bias after its Unsqueeze: a bias Add on
        the 2-D product is fused into the Gemm by ONNX Runtime, which then sums in another order, and a
        Marian's -1e4 entries moved by one float step, 1e-3, failing the export's parity."""
        x = self.dec_norm(x)
        return F.linear(x, self.tgt_embed.weight) if self.out_proj is None else self.out_proj(x)

    # -- training -------------------------------------------------------------
    def forward(self, src_ids: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for right-padded src_ids (B, S) and tgt_in (B, T)."""
        src_mask = src_ids != self.cfg.pad_id
        memory = self.encode(src_ids, src_mask)
        cross_k, cross_v = self.cross_kv(memory)
        past_k, past_v, past_mask = self.empty_past(src_ids.size(0), src_ids.device)
        positions = torch.arange(tgt_in.size(1), device=tgt_in.device).expand_as(tgt_in)
        logits, _, _ = self.decode_step(tgt_in, positions, past_k, past_v, past_mask,
                                        cross_k, cross_v, src_mask)
        return logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
