"""Convert a checkpoint of models/transformer.py into a CTranslate2 model (benchmark only).

    python -m benchmarks.ct2_convert --checkpoint PATH --out DIR [--quantization int8]

The mapping, layer by layer (pre-norm):
    encoder.embed * sqrt(D) + our sinusoidal table   -> encoder.embeddings, scale_embeddings, position_encodings
    EncoderLayer.norm1, self_attn q/k/v (fused), out -> self_attention.layer_norm, linear[0], linear[1]
    EncoderLayer.norm2, ffn.fc1, ffn.fc2             -> ffn.layer_norm, linear_0, linear_1
    DecoderLayer.norm2, cross_attn q, k/v (fused), out -> attention.layer_norm, linear[0..2]
    enc_norm / dec_norm                              -> encoder.layer_norm / decoder.layer_norm
    tied embedding                                   -> decoder.projection (no bias)
Our own position table is written out (CTranslate2's built-in one differs in
layout and offset). Source and target vocabularies are registered separately,
as encoder-decoder specs require, though here they are the same joint list.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from models.evaluate import load_checkpoint
from models.transformer import Transformer, sinusoidal_table


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def _linear(spec, layer: torch.nn.Linear) -> None:
    spec.weight = _np(layer.weight)
    spec.bias = _np(layer.bias) if layer.bias is not None else spec.bias


def _fused(spec, layers: Sequence[torch.nn.Linear]) -> None:
    spec.weight = np.concatenate([_np(x.weight) for x in layers])
    spec.bias = np.concatenate([_np(x.bias) for x in layers])


def _norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _self_attention(spec, attn, norm: torch.nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)  # pre-norm: CTranslate2 keeps the input norm inside the attention spec
    _fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    _linear(spec.linear[1], attn.out_proj)


def _ffn(spec, ffn, norm: torch.nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)


def build_spec(model: Transformer, pieces: list[str]):
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    problems = []
    if not cfg.pre_norm:
        problems.append("only the pre-norm architecture is mapped")
    if cfg.attention != "dot" or cfg.local_window is not None:
        problems.append("CTranslate2 has no additive or local-window attention")
    if problems:
        raise ValueError("cannot convert: " + "; ".join(problems))
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_enc_layers, cfg.n_dec_layers), cfg.n_heads, pre_norm=True,
        activation=common_spec.Activation.RELU)
    table = _np(sinusoidal_table(torch.arange(cfg.max_positions), cfg.d_model))  # (P, D)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _np(model.embed.weight)
    enc.scale_embeddings = True
    enc.position_encodings.encodings = table
    for ours, theirs in zip(model.encoder, enc.layer):
        _self_attention(theirs.self_attention, ours.self_attn, ours.norm1)
        _ffn(theirs.ffn, ours.ffn, ours.norm2)
    _norm(enc.layer_norm, model.enc_norm)
    dec.embeddings.weight = _np(model.tgt_embed.weight)
    dec.scale_embeddings = True
    dec.position_encodings.encodings = table
    for ours, theirs in zip(model.decoder, dec.layer):
        _self_attention(theirs.self_attention, ours.self_attn, ours.norm1)
        _norm(theirs.attention.layer_norm, ours.norm2)
        c = ours.cross_attn
        _linear(theirs.attention.linear[0], c.q_proj)
        _fused(theirs.attention.linear[1], [c.k_proj, c.v_proj])
        _linear(theirs.attention.linear[2], c.out_proj)
        _ffn(theirs.ffn, ours.ffn, ours.norm3)
    _norm(dec.layer_norm, model.dec_norm)
    dec.projection.weight = _np(model.tgt_embed.weight if model.out_proj is None else model.out_proj.weight)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    assert ctranslate2  # imported for its side effect of registering spec types
    return spec


def convert(checkpoint: str | Path, out: str | Path, quantization: str | None = None) -> Path:
    model, tok, _ = load_checkpoint(checkpoint)
    pieces = [tok.piece(i) for i in range(tok.vocab_size)]
    spec = build_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quantization", choices=["int8", "int8_float32", "float32"], default=None)
    args = p.parse_args(argv)
    print(convert(args.checkpoint, args.out, args.quantization))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
