"""What to send and when: the request mix, the request plan, and open-loop arrival schedules.

Everything here is a pure function of the seed: the same seed, mix and source file give the
same requests in the same order, and (open loop) the same send offsets, computed before the
first request goes out and never adjusted to responses.

A mix is a list of weighted entries, from a JSON/YAML file, inline JSON/YAML, or inline
`key=value` pairs with `;` between entries:

    --mix 'rpc=stream weight=3; rpc=unary weight=1 texts=4 beam_size=4'

    # mix.yaml
    - {name: chat, rpc: stream, weight: 3, max_output_tokens: 64}
    - {name: batch, rpc: unary, weight: 1, texts: [2, 8], options: {beam_size: 4}}
    - {name: creative, rpc: stream, temperature: 0.8, top_p: 0.9}
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from client.client import options as decoding_options

RPCS = {"stream": "TranslateStream", "unary": "Translate"}
# Every DecodingOptions field, as the client library's options() names them (tests/unit/test_request_options.py
# checks those against the .proto): a mix entry may set any of them.
OPTION_KEYS = tuple(inspect.signature(decoding_options).parameters)
ALIASES = {"beam": "beam_size", "max_tokens": "max_output_tokens", "n": "num_hypotheses"}
ENTRY_KEYS = ("name", "weight", "rpc", "texts", "model", "timeout", "options")
ARRIVALS = ("poisson", "gamma", "constant")


@dataclass
class MixEntry:
    name: str
    weight: float = 1.0
    rpc: str = "stream"  # stream | unary
    texts: tuple[int, int] = (1, 1)  # texts per call, drawn uniformly from [lo, hi]
    options: dict = field(default_factory=dict)  # DecodingOptions fields
    model: str = ""
    timeout: Optional[float] = None  # per-request deadline (s); None = --timeout

    @property
    def method(self) -> str:
        return RPCS[self.rpc]

    def as_dict(self) -> dict:
        return {"name": self.name, "weight": self.weight, "rpc": self.rpc, "texts": list(self.texts),
                "options": self.options, "model": self.model, "timeout": self.timeout}


def _scalar(text: str) -> Any:
    """Inline values: numbers where they parse, none/null as None, ranges like 2-8, else text."""
    low = text.lower()
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if "-" in text and all(part.isdigit() for part in text.split("-", 1)):
        return [int(part) for part in text.split("-", 1)]
    return text


def _entry(raw: dict, index: int, defaults: dict) -> MixEntry:
    """Validate one entry early: a typo in a mix should fail before any load is sent."""
    raw = {ALIASES.get(k, k): v for k, v in raw.items()}
    unknown = set(raw) - set(ENTRY_KEYS) - set(OPTION_KEYS)
    if unknown:
        raise ValueError(f"mix entry {index}: unknown key(s) {sorted(unknown)}; "
                         f"allowed: {list(ENTRY_KEYS) + list(OPTION_KEYS)}")
    options = {k: v for k, v in defaults.items() if v not in (None, 0, 0.0)}
    options.update({ALIASES.get(k, k): v for k, v in (raw.get("options") or {}).items()})
    options.update({k: raw[k] for k in OPTION_KEYS if k in raw})
    bad = set(options) - set(OPTION_KEYS)
    if bad:
        raise ValueError(f"mix entry {index}: unknown decoding option(s) {sorted(bad)}")
    rpc = str(raw.get("rpc", "stream"))
    if rpc not in RPCS:
        raise ValueError(f"mix entry {index}: rpc must be one of {sorted(RPCS)}, not {rpc!r}")
    texts = raw.get("texts", 1)
    lo, hi = (texts, texts) if isinstance(texts, int) else tuple(int(t) for t in texts)
    if not 1 <= lo <= hi:
        raise ValueError(f"mix entry {index}: texts must be >= 1 (a number or [min, max]), not {texts!r}")
    if rpc == "stream" and hi > 1:
        raise ValueError(f"mix entry {index}: a stream carries one text; use rpc=unary for several")
    if rpc == "stream" and int(options.get("num_hypotheses") or 0) > 1:
        raise ValueError(f"mix entry {index}: a stream returns one hypothesis (num_hypotheses <= 1)")
    weight = float(raw.get("weight", 1.0))
    if weight <= 0:
        raise ValueError(f"mix entry {index}: weight must be > 0")
    name = str(raw.get("name") or f"{rpc}{index}")
    timeout = raw.get("timeout")
    return MixEntry(name, weight, rpc, (lo, hi), options, str(raw.get("model") or ""),
                    None if timeout is None else float(timeout))


def _inline(spec: str) -> list[dict]:
    entries = []
    for part in spec.split(";"):
        if not part.strip():
            continue
        entry = {}
        for token in part.split():
            key, sep, value = token.partition("=")
            if not sep:
                raise ValueError(f"mix: expected key=value, got {token!r}")
            entry[key] = _scalar(value)
        entries.append(entry)
    return entries


def _structured(text: str, suffix: str = "") -> Any:
    if suffix == ".json":
        return json.loads(text)
    try:
        import yaml  # YAML is a superset of JSON, so one parser reads both
    except ImportError:
        return json.loads(text)
    return yaml.safe_load(text)


def load_mix(spec: Optional[str], defaults: Optional[dict] = None, base: Optional[dict] = None) -> list[MixEntry]:
    """Entries from a file path, inline JSON/YAML, or inline key=value text. Without a spec:
    one entry built from `base` (the CLI's --rpc/--texts-per-call flags). `defaults` are
    decoding options every entry starts from (e.g. --max-output-tokens)."""
    defaults = defaults or {}
    if spec is None:
        data: Any = [base or {}]
    elif Path(spec).is_file():
        data = _structured(Path(spec).read_text(encoding="utf-8"), Path(spec).suffix.lower())
    elif spec.lstrip().startswith(("[", "{", "-")):
        data = _structured(spec)
    else:
        data = _inline(spec)
    if isinstance(data, dict):
        data = data.get("mix", data.get("entries", [data]))
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        raise ValueError("mix: expected a non-empty list of entries (mappings)")
    mix = [_entry(d, i, defaults) for i, d in enumerate(data)]
    names = [e.name for e in mix]
    if len(set(names)) != len(names):
        raise ValueError(f"mix: entry names must differ, got {names}")
    return mix


@dataclass
class Request:
    index: int
    entry: MixEntry
    texts: list[str]
    options: dict


class Plan:
    """Request i of a level, identical in every run with the same seed, mix and sources.

    Built lazily in index order (a duration-bound closed loop does not know its count), from
    one RNG for the mix choice and texts per call; sources are taken in order, round-robin,
    so every sentence is used before any repeats.
    """

    def __init__(self, mix: Sequence[MixEntry], sources: Sequence[str], seed: Any):
        if not sources:
            raise ValueError("no source texts")
        self.mix, self.sources = list(mix), list(sources)
        self._weights = [e.weight for e in self.mix]
        self._rng = random.Random(f"plan:{seed}")  # str seeds hash the same in every process
        self._cursor = 0
        self._items: list[Request] = []

    def __getitem__(self, i: int) -> Request:
        while len(self._items) <= i:
            self._items.append(self._draw(len(self._items)))
        return self._items[i]

    def _draw(self, i: int) -> Request:
        entry = self._rng.choices(self.mix, weights=self._weights)[0]
        lo, hi = entry.texts
        n = lo if lo == hi else self._rng.randint(lo, hi)
        texts = [self.sources[(self._cursor + k) % len(self.sources)] for k in range(n)]
        self._cursor += n
        options = dict(entry.options)
        # Sampling without a seed would make every run's outputs (and so lengths) differ;
        # a per-request seed drawn from the plan keeps the work itself reproducible.
        if float(options.get("temperature") or 0) > 0 and options.get("seed") is None:
            options["seed"] = self._rng.getrandbits(63)
        return Request(i, entry, texts, options)

    def digest(self, count: int, times: Optional[Sequence[float]] = None) -> str:
        """A short fingerprint of the first `count` requests (and their send offsets), so
        `compare` can tell whether two runs offered the same work."""
        h = hashlib.sha256()
        for i in range(count):
            r = self[i]
            h.update(f"{r.entry.name}|{len(r.texts)}|{r.texts[0]}|{r.options.get('seed')}\n".encode())
        if times is not None:
            h.update(np.round(np.asarray(times[:count], dtype=float), 6).tobytes())
        return h.hexdigest()[:16]


def _unit_gaps(rng: np.random.Generator, arrival: str, burstiness: float, n: int) -> np.ndarray:
    """Inter-arrival gaps with mean 1. Gamma with shape k has the Poisson mean and a squared
    coefficient of variation 1/k: k < 1 is burstier than Poisson, k > 1 more regular."""
    if arrival == "poisson":
        return rng.exponential(1.0, n)
    if arrival == "gamma":
        return rng.gamma(burstiness, 1.0 / burstiness, n)
    if arrival == "constant":
        return np.ones(n)
    raise ValueError(f"arrival must be one of {ARRIVALS}, not {arrival!r}")


def arrival_times(rate: float, *, arrival: str = "poisson", burstiness: float = 1.0, seed: Any = 0,
                  requests: Optional[int] = None, duration: Optional[float] = None) -> np.ndarray:
    """Send offsets (seconds from the level start) of an open loop offering `rate` requests/s,
    until `requests` have been scheduled or `duration` has passed, whichever comes first.

    The first request goes at 0. Gaps are unit-mean draws divided by the rate, so one seed
    gives the same pattern, stretched, at every rate of a sweep.
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    if requests is None and duration is None:
        raise ValueError("an open loop needs --requests or --duration to end")
    rng = np.random.default_rng(np.frombuffer(hashlib.sha256(f"arrivals:{seed}".encode()).digest()[:8], np.uint64))
    cap = math.inf if requests is None else requests
    end = math.inf if duration is None else duration
    out: list[np.ndarray] = []
    t, count = 0.0, 0
    while count < cap:
        gaps = _unit_gaps(rng, arrival, burstiness, 4096) / rate
        times = t + np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        t = times[-1] + gaps[-1]
        keep = times[times < end][: int(min(cap - count, times.size))]
        out.append(keep)
        count += keep.size
        if keep.size < times.size:
            break
    return np.concatenate(out) if out else np.zeros(0)
