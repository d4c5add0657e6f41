"""Build or load a model of either architecture from a checkpoint's `arch` and `config`.

A checkpoint is {"arch", "config", "model", "meta", ...}; files written before
the GRU baseline existed have no "arch" and are Transformers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import torch

from models.core.config import ModelConfig
from models.gru import GRUConfig, GRUSeq2Seq
from models.transformer import Transformer

Model = Union[Transformer, GRUSeq2Seq]
ARCHS = ("transformer", "gru")


def arch_of(model: Model) -> str:
    return "gru" if isinstance(model, GRUSeq2Seq) else "transformer"


def build_model(arch: str, config: dict[str, Any]) -> Model:
    """A freshly initialised model of `arch` from a config dict (the `config` entry of a checkpoint)."""
    if arch == "transformer":
        return Transformer(ModelConfig.from_dict(config))
    if arch == "gru":
        return GRUSeq2Seq(GRUConfig.from_dict(config))
    raise ValueError(f"unknown architecture {arch!r}; choose from {ARCHS}")


def load_model(path: str | Path, device: str = "cpu") -> tuple[Model, dict]:
    """A checkpoint file -> (model with its weights, in eval mode, on `device`; the checkpoint dict)."""
    state = torch.load(path, map_location=device, weights_only=True)
    model = build_model(state.get("arch", "transformer"), state["config"]).to(device)
    model.load_state_dict(state["model"])
    return model.eval(), state
