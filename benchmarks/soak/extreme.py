"""Extreme but valid decoding settings for the soak: every value at an edge that admission accepts
(server/frontend/hosted.py `param_problems`: temperature in [0, 100], top_p in [0, 1], repetition_penalty in
(0, 10], no_repeat_ngram_size in [0, 10], min_output_tokens up to the output budget, beam_size and
alternatives up to the server's limits; top_k and seed unbounded), alone and combined.

Each must be served (OK, or RESOURCE_EXHAUSTED when the queue is full), never INTERNAL: one request's
settings must not change any other request's status or output. So they run in the random mix and,
by __main__.py's schedule, throughout the pass that translates the golden sentences under load.

Three of them are greedy decoding in disguise (a float32 temperature of 0, top_k 1, top_p 1e-9): their
outputs are kept and compared with the greedy outputs at rest of the same sentences.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Optional

from benchmarks.soak.record import GOOD, BadResponse, Record
from benchmarks.soak.traffic import Traffic, check_translations
from protos.nmt.v1 import translator_pb2 as pb

U32, U64 = 2**32 - 1, 2**64 - 1
TINY = (5e-324, 1e-45, 1e-38, 1.1754943508222875e-38)  # smallest double; float32's smallest denormal, ~ and normal
SERVER_MAX_HYPOTHESES = 8  # --max-hypotheses default (ModelInfo does not carry it)


@dataclass(frozen=True)
class ExtremeCase:
    name: str
    options: dict
    rpc: str = "Translate"
    expect: frozenset = GOOD
    greedy: bool = False  # must equal the greedy output at rest


def extreme_cases(info: pb.ModelInfo) -> list[ExtremeCase]:
    beam, vocab, limit = info.max_beam_size, info.vocab_size or 32_000, info.max_output_tokens or 256
    hyp = min(SERVER_MAX_HYPOTHESES, beam)
    out = [ExtremeCase("temperature=5e-324 (0 in float32)", dict(temperature=5e-324), greedy=True)]
    out += [ExtremeCase(f"temperature={t:g}", dict(temperature=t, seed=i)) for i, t in enumerate(TINY[1:])]
    out += [
        ExtremeCase("temperature=1e-45, num_hypotheses max", dict(temperature=1e-45, seed=7,
                                                                  num_hypotheses=SERVER_MAX_HYPOTHESES)),
        ExtremeCase("temperature=100 (the limit)", dict(temperature=100.0, seed=3, max_output_tokens=32)),
        ExtremeCase("top_k=1", dict(temperature=1.0, top_k=1, seed=4), greedy=True),
        ExtremeCase(f"top_k={vocab} (vocabulary)", dict(temperature=0.8, top_k=vocab, seed=5)),
        ExtremeCase("top_k=2^32-1, temperature=1e-38", dict(temperature=1e-38, top_k=U32, seed=6)),
        ExtremeCase("top_p=1e-9", dict(temperature=1.0, top_p=1e-9, seed=8), greedy=True),
        ExtremeCase("top_p=1e-45, temperature=100", dict(temperature=100.0, top_p=1e-45, seed=9,
                                                         max_output_tokens=32)),
        ExtremeCase("top_p=1", dict(temperature=1.0, top_p=1.0, seed=10)),
        ExtremeCase("seed=0", dict(temperature=0.7, seed=0)),
        ExtremeCase("seed=2^64-1, temperature=1e-45", dict(temperature=1e-45, seed=U64)),
        ExtremeCase("repetition_penalty=1e-45", dict(repetition_penalty=1e-45)),
        ExtremeCase("repetition_penalty=1e-38, sampling", dict(repetition_penalty=1e-38, temperature=1.0, seed=11)),
        ExtremeCase("repetition_penalty=10", dict(repetition_penalty=10.0)),
        ExtremeCase("no_repeat_ngram_size=10", dict(no_repeat_ngram_size=10)),
        ExtremeCase("no_repeat_ngram_size=1", dict(no_repeat_ngram_size=1)),
        ExtremeCase(f"min_output_tokens={limit} (the model's limit)", dict(min_output_tokens=limit)),
        ExtremeCase("min_output_tokens=max_output_tokens=64", dict(min_output_tokens=64, max_output_tokens=64)),
        ExtremeCase("max_output_tokens=1", dict(max_output_tokens=1)),
        ExtremeCase(f"beam_size={beam}, num_hypotheses={hyp}, length_penalty=0",
                    dict(beam_size=beam, num_hypotheses=hyp, length_penalty=0.0)),
        ExtremeCase(f"beam_size={beam}, length_penalty=10", dict(beam_size=beam, length_penalty=10.0)),
        ExtremeCase(f"alternatives={SERVER_MAX_HYPOTHESES}", dict(alternatives=SERVER_MAX_HYPOTHESES)),
        ExtremeCase(f"alternatives={SERVER_MAX_HYPOTHESES}, repetition_penalty=1e-45, no_repeat_ngram_size=1",
                    dict(alternatives=SERVER_MAX_HYPOTHESES, repetition_penalty=1e-45, no_repeat_ngram_size=1)),
        ExtremeCase("all sampling edges", dict(temperature=100.0, top_k=1, top_p=1e-9, repetition_penalty=1e-45,
                                               no_repeat_ngram_size=10, min_output_tokens=64, max_output_tokens=64,
                                               num_hypotheses=SERVER_MAX_HYPOTHESES, seed=U64)),
        ExtremeCase("all tiny (sampling)", dict(temperature=1e-45, top_p=1e-45, repetition_penalty=1e-45,
                                                no_repeat_ngram_size=1, min_output_tokens=limit, seed=12)),
        ExtremeCase("all beam edges", dict(beam_size=beam, num_hypotheses=hyp, length_penalty=10.0,
                                           repetition_penalty=1e-45, no_repeat_ngram_size=1, min_output_tokens=limit)),
        ExtremeCase("stream temperature=1e-45", dict(temperature=1e-45, seed=13), rpc="TranslateStream"),
        ExtremeCase("stream repetition_penalty=1e-45, min_output_tokens max",
                    dict(repetition_penalty=1e-45, min_output_tokens=limit), rpc="TranslateStream"),
        ExtremeCase(f"stream beam_size={beam}, length_penalty=0", dict(beam_size=beam, length_penalty=0.0),
                    rpc="TranslateStream"),
    ]
    return out


def options(case: ExtremeCase) -> pb.DecodingOptions:
    return pb.DecodingOptions(**case.options)


class ExtremeTraffic:
    """Calls with extreme settings through the soak's Traffic (its stub, recorder and deadline), on the
    golden sentences; greedy-in-disguise outputs are kept for the comparison with greedy at rest."""

    def __init__(self, traffic: Traffic, info: pb.ModelInfo, sentences: list[str]):
        self.traffic, self.sentences = traffic, sentences
        self.cases = extreme_cases(info)
        self.greedy_outputs: list[tuple[str, str, str]] = []  # (case, sentence, output)

    @property
    def runners(self) -> dict:
        return {"extreme": self.extreme}

    async def extreme(self, rng: random.Random) -> Record:
        return await self.run(rng.choice(self.cases), rng.choice(self.sentences))

    async def run(self, case: ExtremeCase, text: str) -> Record:
        t = self.traffic
        got: list[str] = []

        async def fn() -> Optional[str]:
            if case.rpc == "TranslateStream":
                call = t.stub.TranslateStream(pb.TranslateStreamRequest(text=text, options=options(case)),
                                              timeout=t.timeout)
                final = False
                async for msg in call:
                    final = final or msg.final
                if not final:
                    raise BadResponse("the stream ended OK without a final message")
                return None
            resp = await t.stub.Translate(pb.TranslateRequest(texts=[text], options=options(case)), timeout=t.timeout)
            check_translations(resp, 1)
            got.append(resp.translations[0].hypotheses[0].text)
            return None
        rec = await t.rec.call("extreme", case.rpc, t.timeout, fn, allowed=case.expect, detail=case.name)
        if case.greedy and got:
            self.greedy_outputs.append((case.name, text, got[0]))
        return rec

    async def run_admitted(self, case: ExtremeCase, text: str, retry_for: float,
                           done: Optional[asyncio.Event] = None) -> Record:
        """The case until it is not refused for a full queue, for up to `retry_for` s or until `done` is set
        (each try recorded)."""
        end = time.monotonic() + retry_for
        while True:
            rec = await self.run(case, text)
            if rec.code != "RESOURCE_EXHAUSTED" or time.monotonic() >= end or (done and done.is_set()):
                return rec
            await asyncio.sleep(0.1)

    async def every_case(self) -> None:
        for i, case in enumerate(self.cases):
            await self.run_admitted(case, self.sentences[i % len(self.sentences)], retry_for=10.0)

    async def alongside(self, done: asyncio.Event, workers: int = 2, rounds: int = 3) -> int:
        """Every case, over and over (at most `rounds` times), from `workers` loops until `done` is set;
        each refused try is retried, so the cases are served while the golden pass runs. Served calls."""
        served = 0

        async def loop(w: int) -> None:
            nonlocal served
            for r in range(rounds):
                for i, case in enumerate(self.cases[w::workers]):
                    if done.is_set():
                        return
                    rec = await self.run_admitted(case, self.sentences[(i + r) % len(self.sentences)], 20.0, done)
                    served += rec.code == "OK"
        await asyncio.gather(*(loop(w) for w in range(workers)))
        return served


def greedy_equivalence(outputs: list[tuple[str, str, str]], at_rest: dict[str, Optional[str]]) -> dict:
    """Greedy-in-disguise outputs against the greedy output at rest of the same sentence."""
    compared = [(c, s, o) for c, s, o in outputs if at_rest.get(s) is not None]
    differ = [{"case": c, "source": s, "output": o, "greedy_at_rest": at_rest[s]} for c, s, o in compared
              if o != at_rest[s]]
    return {"compared": len(compared), "differ": differ[:20], "n_differ": len(differ)}
