"""Model configuration: one dataclass, named presets, JSON round trip.

The same config travels with a checkpoint, into the exported bundle's
`config.json`, and into the CTranslate2 converter, so it holds everything
needed to rebuild the math (sizes, norm placement, attention kind, special ids)
and nothing about training.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal, Optional

# Special token ids are fixed across every tokenizer this project trains, so
# the exporter and the server can rely on them without reading the vocabulary.
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")


class Dimensions:
    """Sizes derived from the fields every model description has (the training config and the
    bundle's spec share them)."""
    vocab_size: int
    tgt_vocab_size: Optional[int]
    d_model: int
    n_heads: int

    @property
    def out_vocab_size(self) -> int:
        """Size of the target vocabulary (the logits' last axis)."""
        return self.tgt_vocab_size or self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class ModelConfig(Dimensions):
    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_enc_layers: int = 3
    n_dec_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    attn_dropout: float = 0.1
    max_positions: int = 512
    pre_norm: bool = True
    attention: Literal["dot", "additive"] = "dot"
    # Encoder self-attention sees only |i - j| <= local_window when set.
    local_window: Optional[int] = None
    tie_embeddings: bool = True  # one table for source and target embeddings
    # The output projection is the target embedding table (None: as tie_embeddings).
    tie_output: Optional[bool] = None
    # A target vocabulary apart from the source one (Marian's separate_vocabs; None: vocab_size).
    tgt_vocab_size: Optional[int] = None
    # -- the knobs imported architectures need (export/huggingface.py); defaults are this repo's models --
    activation: Literal["relu", "gelu", "swish"] = "relu"
    scale_embeddings: bool = True  # token embeddings times sqrt(d_model)
    # Sinusoid i has frequency 10000^(-i / (d_model/2 - position_freq_shift)): 0 here and in Marian,
    # 1 in fairseq's table (M2M100, NLLB).
    position_freq_shift: int = 0
    position_offset: int = 0  # added to 0-based positions (M2M100/NLLB: padding id + 1 = 2)
    final_norms: Optional[bool] = None  # layer norm after the last encoder/decoder layer (None: as pre_norm)
    output_bias: bool = False  # a fixed bias on the logits (Marian's final_logits_bias)
    layer_norm_eps: float = 1e-5
    # Token ids never generated (Marian: the pad id, which is also its decoder start).
    suppress_ids: tuple[int, ...] = ()
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __post_init__(self) -> None:
        if self.tie_output is None:
            self.tie_output = self.tie_embeddings
        if self.final_norms is None:
            self.final_norms = self.pre_norm
        self.suppress_ids = tuple(int(i) for i in self.suppress_ids)
        problems = self.problems()
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every inconsistency at once, CTranslate2-converter style."""
        out = []
        if self.d_model % self.n_heads:
            out.append(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_model % 2:
            out.append(f"d_model={self.d_model} must be even for sinusoidal positions")
        if self.attention not in ("dot", "additive"):
            out.append(f"attention={self.attention!r} is not 'dot' or 'additive'")
        if self.local_window is not None and self.local_window < 1:
            out.append(f"local_window={self.local_window} must be >= 1 or None")
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                out.append(f"{name}={value} must be in [0, 1)")
        if self.activation not in ("relu", "gelu", "swish"):
            out.append(f"activation={self.activation!r} is not relu, gelu or swish")
        if self.tgt_vocab_size is not None and self.tie_embeddings and self.tgt_vocab_size != self.vocab_size:
            out.append(f"tgt_vocab_size={self.tgt_vocab_size} differs from vocab_size={self.vocab_size} "
                       "but the embeddings are tied")
        if not 0 <= self.position_freq_shift < self.d_model // 2:
            out.append(f"position_freq_shift={self.position_freq_shift} must be in [0, d_model/2)")
        # bos_id is the decoder's first input; Marian starts from its pad id, M2M100 from its EOS.
        if len({self.pad_id, self.eos_id, self.unk_id}) != 3:
            out.append("pad, eos and unk ids must be distinct")
        if max(self.pad_id, self.eos_id, self.unk_id) >= self.vocab_size:
            out.append(f"special ids must be < vocab_size={self.vocab_size}")
        if max((self.bos_id, self.eos_id, *self.suppress_ids)) >= self.out_vocab_size or min(
                (self.bos_id, *self.suppress_ids)) < 0:
            out.append(f"bos, eos and suppressed ids must lie in the target vocabulary [0, {self.out_vocab_size})")
        return out

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["suppress_ids"] = list(self.suppress_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {unknown}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def max_output_len(src_len: int, cap: int) -> int:
    """Output budget for a source of `src_len` tokens: generous, never past `cap`.

    One rule for every decoder (PyTorch search, the static ONNX decoder, the
    server), so their outputs can be compared token for token.
    """
    return min(cap, int(src_len * 1.5) + 10)


PRESETS: dict[str, dict[str, Any]] = {
    # Fast enough for unit tests that train to convergence in seconds.
    "tiny": dict(d_model=64, n_heads=4, n_enc_layers=2, n_dec_layers=2, d_ff=128,
                 dropout=0.0, attn_dropout=0.0, max_positions=128),
    # The shipped default: trains on two CPU cores in about an hour.
    "small": dict(d_model=256, n_heads=4, n_enc_layers=3, n_dec_layers=3, d_ff=1024,
                  dropout=0.3, attn_dropout=0.1),
    # "Attention is all you need" base sizes.
    "base": dict(d_model=512, n_heads=8, n_enc_layers=6, n_dec_layers=6, d_ff=2048,
                 dropout=0.1, attn_dropout=0.1),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
