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


@dataclass
class ModelConfig:
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
    tie_embeddings: bool = True
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __post_init__(self) -> None:
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
        ids = {self.pad_id, self.bos_id, self.eos_id, self.unk_id}
        if len(ids) != 4 or max(ids) >= self.vocab_size:
            out.append("special ids must be distinct and < vocab_size")
        return out

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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
