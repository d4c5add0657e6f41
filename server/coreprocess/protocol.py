"""The messages between a frontend and the engine core process: msgspec Structs, one per frame of the
frontend's connection to the core (server/coreprocess/channel.py).

Plain data only (no protobuf, no grpc): the frontend sends the jobs its admission step built and
the cancellations of its callers; the core's main thread answers them (Ready, Accepted, Refused,
MetricsText), and each engine thread sends, once per engine step, one `Events` message per frontend
carrying every new token, result and error of that frontend's jobs on that model, itself, on the same
connection (server/coreprocess/process.py says why).
Why msgspec's MessagePack: typed structs decoded without a Python object per field of an intermediate dict, ~1 us per job
spec either way, and a tagged union so each frame names its own kind.
"""
from __future__ import annotations

from typing import Optional, Union

import msgspec

from server.core.request import DecodingParams


class Params(msgspec.Struct, array_like=True, frozen=True):
    """DecodingParams on the wire (the same fields, in order)."""
    beam_size: int
    length_penalty: float
    temperature: float
    top_k: int
    top_p: float
    seed: Optional[int]
    max_output_tokens: int
    num_hypotheses: int
    repetition_penalty: float
    no_repeat_ngram_size: int
    min_output_tokens: int
    no_unknown_token: bool
    target_prefix: str
    alternatives: int


PARAM_FIELDS = Params.__struct_fields__


def params_out(p: DecodingParams) -> Params:
    return Params(*(getattr(p, name) for name in PARAM_FIELDS))


def params_in(p: Params) -> DecodingParams:
    return DecodingParams(*(getattr(p, name) for name in PARAM_FIELDS))


class JobSpec(msgspec.Struct, array_like=True):
    """A Job (or, with kind "embed", an EmbedJob) without its sink: the core builds its own."""
    id: int
    kind: str  # "translate" | "embed"
    model: str
    src_ids: list[int]
    arrival: float  # time.monotonic() (one clock for every process of the host)
    deadline: Optional[float] = None
    params: Optional[Params] = None
    max_len: int = 0
    scores: bool = False
    stream: bool = False
    forced: tuple[int, ...] = ()
    prefix: tuple[int, ...] = ()
    # Glossary terms (server/core/request.py Job.terms): (spellings as written, other spellings, text forms).
    terms: tuple[tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], tuple[str, ...]], ...] = ()
    background: bool = False  # server/core/request.py Job.background


# -- frontend -> core ---------------------------------------------------------------
class Hello(msgspec.Struct, tag=True, array_like=True):
    """A frontend's first message on its connection, naming it (the primary's Forget names a dead
    frontend the same way); answered by Ready."""
    identity: bytes = b""


class Submit(msgspec.Struct, tag=True, array_like=True):
    """Queue these jobs atomically (all of a request, or none); answered by Accepted or Refused."""
    ticket: int
    model: str
    jobs: list[JobSpec]


class Cancel(msgspec.Struct, tag=True, array_like=True):
    ids: list[int]


class Hold(msgspec.Struct, tag=True, array_like=True):
    """The frontend is behind (its streams have not taken the last Events yet): collect until Resume."""


class Resume(msgspec.Struct, tag=True, array_like=True):
    """The frontend has caught up: send what was collected, and each step's events again."""


class AskMetrics(msgspec.Struct, tag=True, array_like=True):
    ticket: int


class Forget(msgspec.Struct, tag=True, array_like=True):
    """From the primary frontend: the frontend with this identity (its Hello) has died; cancel its jobs."""
    identity: bytes


class Stop(msgspec.Struct, tag=True, array_like=True):
    """Refuse new work, finish what runs within `grace` seconds, fail the rest, then exit."""
    grace: float


# -- core -> frontend ---------------------------------------------------------------
class ModelFacts(msgspec.Struct, array_like=True):
    name: str
    provider: str
    capacity: int  # decode slots
    variant: str  # the bundle variant whose graphs run (int8 may be int8-vnni: models/core/runtime.py)
    row_cost_s: float = 0.0  # a row's share of a decode step, measured once warm (placement.py); 0 = unmeasured


class Ready(msgspec.Struct, tag=True, array_like=True):
    models: list[ModelFacts]
    pid: int


class Accepted(msgspec.Struct, tag=True, array_like=True):
    ticket: int


class Refused(msgspec.Struct, tag=True, array_like=True):
    ticket: int
    code: str  # a ServiceError kind's code (server/core/errors.py)
    message: str


class Tokens(msgspec.Struct, tag=True, array_like=True):
    id: int
    token_ids: list[int]


class Finished(msgspec.Struct, tag=True, array_like=True):
    id: int
    hypotheses: list[tuple[list[int], float, bool]]  # (tokens, score, finished_by_eos)
    reason: str  # FinishReason value
    input_tokens: int
    timing: tuple[Optional[float], Optional[float], Optional[float], Optional[float]]  # scheduled, first, finished, last


class Failed(msgspec.Struct, tag=True, array_like=True):
    id: int
    code: str
    message: str


class Embedded(msgspec.Struct, tag=True, array_like=True):
    id: int
    vector: bytes  # float32, native byte order (both ends are one host)


Event = Union[Tokens, Finished, Failed, Embedded]


class Events(msgspec.Struct, tag=True, array_like=True):
    """Everything that happened to one frontend's jobs since its previous Events message, in order;
    consecutive Tokens of one job are merged (the frontend was behind: one message, not several)."""
    items: list[Event]


class MetricsText(msgspec.Struct, tag=True, array_like=True):
    ticket: int
    text: str  # the core registry's Prometheus exposition


ToCore = Union[Hello, Submit, Cancel, Hold, Resume, AskMetrics, Forget, Stop]
ToFrontend = Union[Ready, Accepted, Refused, Events, MetricsText]

encode = msgspec.msgpack.Encoder().encode
to_core = msgspec.msgpack.Decoder(ToCore).decode
to_frontend = msgspec.msgpack.Decoder(ToFrontend).decode
