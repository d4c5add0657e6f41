"""The soak harness's traffic: one call of each category (what each may get back, and how calls are
recorded: record.py).
"""
from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable, Optional

import grpc

from benchmarks.soak.fuzz import RAW_METHOD, FuzzCase, option_cases, raw_cases
from benchmarks.soak.record import BadResponse, Record, Recorder
from client.client import AsyncTranslatorClient
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc

# The random mix. Streams (stream, slow_reader, channel_close, stream_cancel) are 34 parts, 7 of them
# cancelled (~20%); deadline_short is ~10% of all calls.
MIX = {"translate_one": 20, "translate_many": 6, "stream": 20, "slow_reader": 4, "channel_close": 3,
       "stream_cancel": 7, "embed": 6, "list_models": 3, "health": 3, "fuzz_raw": 6, "fuzz_options": 8,
       "deadline_short": 10}


def decoding(rng: random.Random, max_beam: int) -> tuple[str, dict]:
    """Half greedy, a quarter beam (2-5), a quarter seeded sampling with top-k / top-p."""
    r = rng.random()
    if r < 0.5:
        return "greedy", {}
    if r < 0.75:
        return "beam", {"beam_size": rng.randint(2, min(5, max_beam))}
    return "sampling", {"temperature": round(rng.uniform(0.3, 1.2), 3), "top_k": rng.choice([0, 5, 50]),
                        "top_p": rng.choice([0.0, 0.9, 0.95]), "seed": rng.randrange(2**32),
                        "max_output_tokens": rng.randint(8, 64)}


def check_translations(resp: pb.TranslateResponse, n: int) -> None:
    if len(resp.translations) != n or any(not t.hypotheses for t in resp.translations):
        raise BadResponse(f"{len(resp.translations)} translations for {n} texts (or one without hypotheses)")


async def read_stream(call, pause: Callable[[], float] = lambda: 0.0, stop_after: int = 0,
                      on_message: Optional[Callable[[], None]] = None) -> Optional[str]:
    """Read a stream to its end (it must end with a final message), pausing between reads; with
    stop_after, cancel it after that many messages and return the code the call ends with."""
    n, final = 0, False
    async for msg in call:
        n, final = n + 1, msg.final
        if on_message:
            on_message()
        if stop_after and n >= stop_after and not final:
            call.cancel()
            return (await call.code()).name
        delay = pause()
        if delay:
            await asyncio.sleep(delay)
    if not final:
        raise BadResponse(f"the stream ended OK after {n} messages without a final one")
    return None


class Traffic:
    """One call of each category against `target`, all through one recorder."""

    def __init__(self, target: str, recorder: Recorder, sentences: list[str], models: pb.ListModelsResponse,
                 call_timeout: float, seed: int):
        self.target, self.rec, self.sentences, self.timeout = target, recorder, sentences, call_timeout
        info = next(m for m in models.models if m.is_default)
        self.max_texts, self.max_beam = info.max_texts_per_request, info.max_beam_size
        self.client = AsyncTranslatorClient(target, timeout=call_timeout, retries=0)  # see every code as sent
        self.stub = self.client.stub
        self.raw = self.client.channel.unary_unary(RAW_METHOD)  # bytes in, bytes out: no serializer
        fuzz_rng = random.Random(seed)
        self.raw_cases = raw_cases(fuzz_rng, sentences)
        self.option_cases = option_cases(self.max_texts, self.max_beam)
        self.mix = dict(MIX)
        self.runners = {name: getattr(self, name) for name in MIX}

    def extend(self, mix: dict[str, int], runners: dict[str, Callable[[random.Random], Awaitable[Record]]]) -> None:
        """More categories in the random mix (HTTP, extreme settings): weights and one runner each."""
        self.mix.update(mix)
        self.runners.update(runners)

    async def close(self) -> None:
        await self.client.close()

    async def random_call(self, rng: random.Random) -> Record:
        category = rng.choices(list(self.mix), weights=list(self.mix.values()))[0]
        return await self.runners[category](rng)

    # -- legal traffic -------------------------------------------------------------------------------
    async def translate_one(self, rng: random.Random) -> Record:
        mode, opts = decoding(rng, self.max_beam)
        text = rng.choice(self.sentences)

        async def fn():
            check_translations(await self.client.translate([text], timeout=self.timeout, **opts), 1)
        return await self.rec.call("translate_one", "Translate", self.timeout, fn, detail=mode)

    async def translate_many(self, rng: random.Random) -> Record:
        mode, opts = decoding(rng, self.max_beam)
        texts = rng.choices(self.sentences, k=rng.randint(2, self.max_texts))

        async def fn():
            check_translations(await self.client.translate(texts, timeout=self.timeout, **opts), len(texts))
        return await self.rec.call("translate_many", "Translate", self.timeout, fn, detail=mode)

    async def stream(self, rng: random.Random) -> Record:
        mode, opts = decoding(rng, self.max_beam)
        text = rng.choice(self.sentences)
        return await self.rec.call("stream", "TranslateStream", self.timeout, lambda: read_stream(
            self.client.translate_stream(text, timeout=self.timeout, **opts)), detail=mode)

    async def slow_reader(self, rng: random.Random) -> Record:
        # A reader that sleeps between messages: the server must buffer, not block its engine or loop.
        text, gap = rng.choice(self.sentences), rng.uniform(0.05, 0.25)
        return await self.rec.call("slow_reader", "TranslateStream", self.timeout, lambda: read_stream(
            self.client.translate_stream(text, timeout=self.timeout, max_output_tokens=48), pause=lambda: gap),
            detail=f"{1e3 * gap:.0f} ms between reads")

    async def stream_cancel(self, rng: random.Random) -> Record:
        mode, opts = decoding(rng, self.max_beam)
        text, after = rng.choice(self.sentences), rng.randint(1, 3)
        return await self.rec.call("stream_cancel", "TranslateStream", self.timeout, lambda: read_stream(
            self.client.translate_stream(text, timeout=self.timeout, **opts), stop_after=after),
            detail=f"{mode}, cancelled after {after} messages")

    async def channel_close(self, rng: random.Random) -> Record:
        text, after = rng.choice(self.sentences), rng.randint(1, 2)

        async def fn():
            channel = grpc.aio.insecure_channel(self.target)
            try:
                call = pb_grpc.TranslatorStub(channel).TranslateStream(
                    pb.TranslateStreamRequest(text=text), timeout=self.timeout)
                n = 0
                async for msg in call:
                    n += 1
                    if msg.final:
                        return None
                    if n >= after:
                        break
                await channel.close()  # the whole connection goes away mid-stream
                return (await call.code()).name
            finally:
                await channel.close()
        return await self.rec.call("channel_close", "TranslateStream", self.timeout, fn,
                                   detail=f"closed after {after} messages")

    async def embed(self, rng: random.Random) -> Record:
        texts = rng.choices(self.sentences, k=rng.randint(1, self.max_texts))

        async def fn():
            resp = await self.client.embed(texts, normalize=rng.random() < 0.5, timeout=self.timeout)
            if len(resp.embeddings) != len(texts) or any(len(e.values) != resp.dimension for e in resp.embeddings):
                raise BadResponse(f"{len(resp.embeddings)} embeddings for {len(texts)} texts, or wrong dimension")
        return await self.rec.call("embed", "Embed", self.timeout, fn)

    async def list_models(self, rng: random.Random) -> Record:
        async def fn():
            if not (await self.client.list_models(timeout=self.timeout)).models:
                raise BadResponse("ListModels listed no model")
        return await self.rec.call("list_models", "ListModels", self.timeout, fn)

    async def health(self, rng: random.Random) -> Record:
        async def fn():
            status = await self.client.health(timeout=self.timeout)
            if status != "SERVING":
                raise BadResponse(f"health {status}")
        return await self.rec.call("health", "Check", self.timeout, fn)

    async def deadline_short(self, rng: random.Random) -> Record:
        # 5-30 ms: an encoder pass plus a few decode steps of a long sentence already take about that.
        budget = rng.uniform(0.005, 0.030)
        texts = rng.choices(self.sentences, k=rng.randint(1, 8))
        if rng.random() < 0.3:
            return await self.rec.call("deadline_short", "TranslateStream", budget, lambda: read_stream(
                self.client.translate_stream(texts[0], timeout=budget)), detail=f"{1e3 * budget:.0f} ms")
        opts = {"beam_size": 4} if rng.random() < 0.3 else {}

        async def fn():
            check_translations(await self.client.translate(texts, timeout=budget, **opts), len(texts))
        return await self.rec.call("deadline_short", "Translate", budget, fn, detail=f"{1e3 * budget:.0f} ms")

    # -- hostile traffic -----------------------------------------------------------------------------
    async def fuzz_raw(self, rng: random.Random) -> Record:
        case = rng.choice(self.raw_cases)

        async def fn():
            await self.raw(case.payload, timeout=10.0)
        return await self.rec.call("fuzz_raw", "Translate", 10.0, fn, allowed=case.expect, detail=case.name)

    async def every_fuzz_case(self) -> None:
        """Each hostile option case and one raw payload of each kind, so no case is left to the dice."""
        for case in self.option_cases:
            await self.fuzz_case(case, "fuzz_options")
        for kind in sorted({c.name for c in self.raw_cases}):
            case = next(c for c in self.raw_cases if c.name == kind)
            await self.rec.call("fuzz_raw", "Translate", 10.0, lambda: self.raw(case.payload, timeout=10.0),
                                allowed=case.expect, detail=case.name)

    async def fuzz_options(self, rng: random.Random) -> Record:
        return await self.fuzz_case(rng.choice(self.option_cases), "fuzz_options")

    async def fuzz_case(self, case: FuzzCase, category: str) -> Record:
        async def fn():
            if case.rpc == "TranslateStream":
                return await read_stream(self.stub.TranslateStream(case.payload, timeout=self.timeout))
            resp = await getattr(self.stub, case.rpc)(case.payload, timeout=self.timeout)
            if case.rpc == "Translate":
                check_translations(resp, len(case.payload.texts))
        return await self.rec.call(category, case.rpc, self.timeout, fn, allowed=case.expect, detail=case.name)

    # -- scheduled traffic (benchmarks/soak/__main__.py decides when) ---------------------------------------------
    async def burst(self, calls: int, seed: int) -> list[Record]:
        """`calls` requests of max_texts / 8 texts at once, far past a small queue: some are refused at
        once, the rest fill the decode slots; seeded high-temperature sampling rarely stops early, so
        they stay busy. (Requests of max_texts texts would all be refused under load: each needs the
        whole queue empty.)"""
        opts = dict(temperature=2.0, seed=seed, max_output_tokens=48)
        texts = [self.sentences[(seed + i) % len(self.sentences)] for i in range(max(1, self.max_texts // 8))]

        async def fn():
            check_translations(await self.client.translate(texts, timeout=self.timeout, **opts), len(texts))
        return list(await asyncio.gather(*(self.rec.call("burst", "Translate", self.timeout, fn,
                                                         detail=f"{len(texts)} texts") for _ in range(calls))))

    async def golden(self, category: str, sentences: list[str], retry_for: float = 0.0) -> list[Optional[str]]:
        """Greedy translations, one call per sentence, in order; refused attempts are retried for up to
        `retry_for` seconds per sentence (each attempt is recorded). None where none succeeded."""
        out: list[Optional[str]] = []
        for text in sentences:
            got: list[str] = []

            async def fn():
                resp = await self.client.translate([text], timeout=self.timeout)
                check_translations(resp, 1)
                got.append(resp.translations[0].hypotheses[0].text)
            end = time.monotonic() + retry_for
            while True:
                rec = await self.rec.call(category, "Translate", self.timeout, fn)
                if rec.code != "RESOURCE_EXHAUSTED" or time.monotonic() >= end:
                    break
                await asyncio.sleep(0.1)
            out.append(got[0] if got else None)
        return out

