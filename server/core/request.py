"""What flows between the service, the scheduler and the engine: plain data, no protobuf.

A `Translate` call with N texts becomes N `Job`s; a stream is one `Job`; an
`Embed` call is one `EmbedJob` per text. The engine thread reports progress
through the job's `sink`, a callable the service side supplies (it hops the
event onto its asyncio loop), so the engine never touches gRPC objects.
"""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from models.core.beam import Hypothesis  # noqa: F401 (one Hypothesis type for the whole house)

_ids = itertools.count(1)


class FinishReason(enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    CANCELLED = "cancelled"
    RUNAWAY = "runaway"  # stopped by the runaway guard (server/core/runaway.py)


@dataclass(frozen=True)
class DecodingParams:
    beam_size: int = 1
    length_penalty: float = 1.0
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    max_output_tokens: int = 0  # 0 = model limit
    num_hypotheses: int = 1
    # Decoding controls (server/core/chooser.py applies them where the token is chosen)
    repetition_penalty: float = 1.0  # 1 = off
    no_repeat_ngram_size: int = 0  # 0 = off
    min_output_tokens: int = 0  # EOS banned before this many output tokens
    no_unknown_token: bool = False
    target_prefix: str = ""  # text the translation must start with (tokenised by the hosted model)
    alternatives: int = 0  # n continuations at the first position after the prefix, one row each

    @property
    def controlled(self) -> bool:
        """Any control that needs the row's history or a ban at choice time."""
        return (self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0 or self.min_output_tokens > 0
                or self.no_unknown_token)

    @property
    def sampling(self) -> bool:
        return self.temperature > 0.0

    @property
    def rows(self) -> int:
        """Decode rows (batch slots) this request occupies."""
        return self.beam_size if self.beam_size > 1 else self.alternatives or self.num_hypotheses


@dataclass(frozen=True)
class GenerationRules:
    """A model's fixed rules for choosing tokens (from its bundle), applied to every request."""
    eos_id: int
    suppress_ids: tuple[int, ...] = ()  # never generated (Marian: its pad id)
    force_eos_at_limit: bool = False  # the last token a length budget allows is EOS (Marian's forced_eos_token_id)
    # Beam log-probs renormalised after suppression (Hugging Face's renormalize_logits, set by OPUS-MT);
    # otherwise suppressed tokens are cut from log_softmax over the whole vocabulary.
    renormalize: bool = False
    # Beam search ends with K finished hypotheses (True), or goes on while a live beam could still
    # beat them (False: Hugging Face's default, kept by imported models; see models/core/beam.py).
    early_stopping: bool = True
    start_id: int = 1  # the decoder's first input (BOS, or the model's decoder start token): part of the history
    # Each token's piece (its text, with the tokenizer's word mark): what glossary bookkeeping reads of the
    # output (server/core/terms.py). Empty: the model's jobs carry no glossary terms.
    pieces: tuple[str, ...] = ()


@dataclass
class Timing:
    arrival: float = field(default_factory=time.monotonic)
    scheduled: Optional[float] = None  # left the queue (encoder pass starts)
    first_token: Optional[float] = None
    finished: Optional[float] = None
    last_token: Optional[float] = None

    def seconds(self) -> dict[str, float]:
        end = self.finished or time.monotonic()
        return {"queue": (self.scheduled or end) - self.arrival,
                "first_token": (self.first_token or end) - self.arrival,
                "total": end - self.arrival}


@dataclass
class TokenEvent:
    """New tokens of hypothesis 0 (streaming jobs only): the first at once, then every
    `stream_interval` tokens, the rest just before the FinishEvent; beam search sends them
    once, at the end."""
    token_ids: list[int]


@dataclass
class FinishEvent:
    hypotheses: list[Hypothesis]
    reason: FinishReason
    input_tokens: int
    timing: Timing


@dataclass
class ErrorEvent:
    error: Exception


Event = TokenEvent | FinishEvent | ErrorEvent


class _Work:
    """What a Job and an EmbedJob share: cancellation (carried to another process's scheduler by
    `on_cancel` where the job lives there), the deadline, and the form a failure reaches the sink in."""

    def cancel(self) -> None:
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel(self)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def failure(self, error: Exception):
        """What the sink gets when the job fails with `error`."""
        return ErrorEvent(error)


@dataclass
class Job(_Work):
    """One text to translate, from submission until its FinishEvent."""
    model: str
    src_ids: list[int]
    params: DecodingParams
    max_len: int
    sink: Callable[[Event], None]
    deadline: Optional[float] = None  # time.monotonic() value
    id: int = field(default_factory=lambda: next(_ids))
    timing: Timing = field(default_factory=Timing)
    cancelled: bool = False  # set from the service side; read by the engine thread
    answered: bool = False  # a terminal event (finish or error) went to the sink: never a second one
    scores: bool = False  # report hypothesis log-probabilities (beam search always has them)
    stream: bool = False  # send TokenEvents as tokens are decoded (else only the FinishEvent)
    # Tokens forced as the first outputs (M2M100/NLLB: the target-language token), with log-prob 0
    # as Hugging Face's ForcedBOSTokenLogitsProcessor gives them; not part of the returned tokens.
    forced: tuple[int, ...] = ()
    # Tokens the translation must start with (a target prefix): forced after `forced`, and part of
    # the output (returned, streamed); max_len counts them on top of the request's budget.
    prefix: tuple[int, ...] = ()
    # Called by cancel() when the job lives in another process's scheduler (the engine core's link).
    on_cancel: Optional[Callable[["Job"], None]] = None
    # Glossary terms the translation must contain (server/core/terms.py): one constraint per
    # target term, each (its spellings as written, its other forms' spellings, its text forms), a
    # spelling being a token sequence.
    terms: tuple[tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], tuple[str, ...]], ...] = ()
    # Background work (a document file's segments, a caller's PRIORITY_BACKGROUND): admitted after every
    # waiting interactive job, and sent to the engine replica with the least interactive work.
    background: bool = False


@dataclass
class EmbedJob(_Work):
    """Encoder-only work: mean-pooled encoder states of one text."""
    model: str
    src_ids: list[int]
    sink: Callable[[np.ndarray | Exception], None]
    deadline: Optional[float] = None
    id: int = field(default_factory=lambda: next(_ids))
    timing: Timing = field(default_factory=Timing)
    cancelled: bool = False
    answered: bool = False  # as Job.answered
    on_cancel: Optional[Callable[["EmbedJob"], None]] = None  # as Job.on_cancel
    background: bool = False  # as Job.background (embeddings are always interactive)

    def failure(self, error: Exception):
        return error  # an embedding's sink takes the vector or the exception
