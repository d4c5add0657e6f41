"""Hostile requests for the soak harness (benchmarks/soak/__main__.py), each with the status codes it may get.

Two kinds:
  * raw wire payloads for /nmt.v1.Translator/Translate, sent as bytes with no
    serializer: random bytes, valid messages cut inside a field, invalid UTF-8
    in a string field, known fields sent with the wrong wire type. Every one is
    checked here with the same protobuf runtime the server uses, and kept only
    if the server must refuse it: it does not parse at all, or it parses to a
    request with neither model nor texts (protobuf keeps a wrongly-typed field
    as an unknown field, so `texts` as a varint parses to "no texts"). Either
    way the only right answer is INVALID_ARGUMENT.
  * well-formed messages with hostile values: NaN / inf / negative floats,
    2^32-1 and 2^64-1 integers, unknown model names up to 20,000 characters,
    empty / whitespace-only (answered as layout) / 100k-character texts, 1000 texts, emoji, CJK and
    control characters.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Union

from google.protobuf.message import DecodeError

from protos.nmt.v1 import translator_pb2 as pb

RAW_METHOD = "/nmt.v1.Translator/Translate"
OK_OR_FULL = frozenset({"OK", "RESOURCE_EXHAUSTED"})  # a legal request may meet a full queue
INVALID = frozenset({"INVALID_ARGUMENT"})
NOT_FOUND = frozenset({"NOT_FOUND"})
U32, U64 = 2**32 - 1, 2**64 - 1
NAN, INF = float("nan"), float("inf")

Request = Union[pb.TranslateRequest, pb.TranslateStreamRequest, pb.EmbedRequest]


@dataclass(frozen=True)
class FuzzCase:
    name: str
    rpc: str  # Translate | TranslateStream | Embed (raw payloads always go to Translate)
    payload: Union[Request, bytes]
    expect: frozenset


# -- raw payloads ------------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _delimited_spans(data: bytes) -> list[tuple[int, int]]:
    """(payload start, payload end) of each top-level length-delimited field of a valid message."""
    spans, pos = [], 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            spans.append((pos, pos + length))
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return spans


def must_refuse(payload: bytes) -> bool:
    """True when a server on this protobuf runtime cannot serve the payload: it fails to parse, or it
    parses to a request with no model and no texts (INVALID_ARGUMENT whatever else it holds)."""
    try:
        msg = pb.TranslateRequest.FromString(payload)
    except DecodeError:
        return True
    return not msg.model and not msg.texts


def _valid_request(rng: random.Random, texts: list[str]) -> bytes:
    opts = pb.DecodingOptions(beam_size=rng.choice([0, 2, 4]), max_output_tokens=rng.randint(1, 40))
    return pb.TranslateRequest(texts=rng.sample(texts, rng.randint(1, 3)), options=opts,
                               return_scores=True).SerializeToString()


def _truncated(rng: random.Random, texts: list[str]) -> bytes:
    # A cut inside a length-delimited payload leaves its declared length unsatisfied, so the
    # message cannot parse; a cut at a field boundary would just be a shorter valid request.
    data = _valid_request(rng, texts)
    start, end = rng.choice([s for s in _delimited_spans(data) if s[1] > s[0]])
    return data[:rng.randint(start, end - 1)]


BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80")


def _bad_utf8(rng: random.Random, texts: list[str]) -> bytes:
    text = rng.choice(texts).encode()
    cut = rng.randint(0, len(text))
    bad = text[:cut] + rng.choice(BAD_UTF8) + text[cut:]
    field = rng.choice([1, 2])  # model or texts
    good = pb.TranslateRequest(texts=[rng.choice(texts)]).SerializeToString()
    return good + _varint(field << 3 | 2) + _varint(len(bad)) + bad


def _wrong_wire_type(rng: random.Random, texts: list[str]) -> bytes:
    field = rng.choice([1, 2, 3])  # model, texts, options: all length-delimited in the schema
    wire = rng.choice([0, 1, 5, 3])  # varint, fixed64, fixed32, start-group (never closed)
    body = {0: _varint(rng.randint(0, U64)), 1: rng.randbytes(8), 5: rng.randbytes(4), 3: b""}[wire]
    return _varint(field << 3 | wire) + body


def _random_bytes(rng: random.Random, texts: list[str]) -> bytes:
    return rng.randbytes(rng.randint(1, 96))


RAW_KINDS = {"random_bytes": _random_bytes, "truncated": _truncated, "bad_utf8": _bad_utf8,
             "wrong_wire_type": _wrong_wire_type}


def raw_cases(rng: random.Random, texts: list[str], per_kind: int = 40) -> list[FuzzCase]:
    out = []
    for kind, make in RAW_KINDS.items():
        made = 0
        while made < per_kind:
            payload = make(rng, texts)
            if must_refuse(payload):  # e.g. random bytes that happen to spell a legal request are dropped
                out.append(FuzzCase(f"raw/{kind}", "Translate", payload, INVALID))
                made += 1
    return out


# -- hostile values in well-formed messages -------------------------------------------------------------
def option_cases(max_texts: int, max_beam: int) -> list[FuzzCase]:
    O, T, S, E = pb.DecodingOptions, pb.TranslateRequest, pb.TranslateStreamRequest, pb.EmbedRequest
    dog = ["A dog runs on the beach."]
    cases = [
        *[(f"temperature={v}", T(texts=dog, options=O(temperature=v)), INVALID) for v in (NAN, INF, -INF, -1.0, 1e30)],
        *[(f"top_p={v}", T(texts=dog, options=O(temperature=1.0, top_p=v, seed=1)), INVALID)
          for v in (NAN, INF, -0.5, 1.5)],
        *[(f"length_penalty={v}", T(texts=dog, options=O(beam_size=2, length_penalty=v)), INVALID)
          for v in (NAN, INF, -1.0)],
        ("beam_size=2^32-1", T(texts=dog, options=O(beam_size=U32)), INVALID),
        (f"beam_size={max_beam + 1}", T(texts=dog, options=O(beam_size=max_beam + 1)), INVALID),
        ("num_hypotheses=2^32-1", T(texts=dog, options=O(temperature=1.0, num_hypotheses=U32)), INVALID),
        ("max_output_tokens=2^32-1", T(texts=dog, options=O(max_output_tokens=U32)), INVALID),
        ("beam+sampling", T(texts=dog, options=O(beam_size=3, temperature=0.5)), INVALID),
        # top_k past the vocabulary means "no limit" to one reading of the API and "out of range" to another.
        ("top_k=2^32-1", T(texts=dog, options=O(temperature=1.0, top_k=U32, seed=2)), OK_OR_FULL | INVALID),
        ("seed=2^64-1", T(texts=dog, options=O(temperature=0.8, seed=U64, max_output_tokens=30)), OK_OR_FULL),
        *[(f"model={n} chars", T(model="x" * n, texts=dog), NOT_FOUND) for n in (1, 255, 4096, 20_000)],
        ("model=emoji+control", T(model="🤖\x00\x1b[31m模型", texts=dog), NOT_FOUND),
        ("texts=[]", T(), INVALID),
        ("texts=['']", T(texts=[""]), INVALID),
        # Blank-looking text is layout: it comes back as it is (docs/documents.md); only '' is refused.
        ("texts=[whitespace]", T(texts=[" \t\n\u00a0\u2009 "]), OK_OR_FULL),
        ("texts=[zero-width]", T(texts=["\u200b\u00ad"]), OK_OR_FULL),
        ("texts=[ok, '']", T(texts=["A dog.", ""]), INVALID),
        ("texts=[100k chars]", T(texts=["word " * 20_000]), INVALID),
        ("texts=1000", T(texts=["A dog."] * 1000), INVALID),
        (f"texts={max_texts + 1}", T(texts=["A dog."] * (max_texts + 1)), INVALID),
        ("text=emoji", T(texts=["A dog 🐶 chases a ball 🎾 in the park 🌳."]), OK_OR_FULL),
        # Without a source language, texts confidently in a language no model serves are refused (the
        # source language is detected: server/frontend/language_id.py); named as English, they are translated.
        ("text=CJK", T(texts=["一只狗在公园里跑。", "犬が公園で走っている。"]), INVALID),
        ("text=CJK as en", T(texts=["一只狗在公园里跑。", "犬が公園で走っている。"], source_language="en"), OK_OR_FULL),
        ("text=RTL+combining", T(texts=["A man says كلب and e\u0301te\u0301."]), OK_OR_FULL),
        ("text=control chars", T(texts=["A\x00 dog\x07 runs\x1b[31m on\x7f the beach."]), OK_OR_FULL),
        # Only control characters: nothing visible to translate; an error or a translation are both sane.
        ("text=control only", T(texts=["\x00\x01\x02\x03"]), OK_OR_FULL | INVALID),
        ("stream text=''", S(text=""), INVALID),
        ("stream text=whitespace", S(text="   \n\t "), OK_OR_FULL),
        ("stream num_hypotheses=2", S(text=dog[0], options=O(beam_size=3, num_hypotheses=2)), INVALID),
        ("stream temperature=nan", S(text=dog[0], options=O(temperature=NAN)), INVALID),
        ("stream text=100k chars", S(text="x" * 100_000), INVALID),
        ("stream model=20000 chars", S(model="m" * 20_000, text=dog[0]), NOT_FOUND),
        ("stream text=emoji+CJK", S(text="Two dogs 🐕🐕 play in the snow ❄️ 雪."), OK_OR_FULL),
        ("embed texts=[]", E(), INVALID),
        ("embed texts=[whitespace]", E(texts=["  "]), INVALID),
        ("embed texts=1000", E(texts=["A dog."] * 1000), INVALID),
        ("embed text=100k chars", E(texts=["y" * 100_000]), INVALID),
        ("embed model=20000 chars", E(model="e" * 20_000, texts=dog), NOT_FOUND),
        ("embed text=emoji", E(texts=["🙂 A cat sleeps. 猫"], normalize=True), OK_OR_FULL),
    ]
    rpc_of = {T: "Translate", S: "TranslateStream", E: "Embed"}
    return [FuzzCase(name, rpc_of[type(msg)], msg, expect) for name, msg, expect in cases]
