"""What the DeepL and LibreTranslate endpoints share: texts in, one Translate call per source language,
results back in the texts' order.

Both APIs let a caller leave the source language out and report, per text, the language that
was detected. Texts of one request may be in different languages, so each is identified on its
own and the texts are grouped by the served language they route to (admission's `sources_of`, off the
event loop: up to 64 texts); each group is one Translate call through the gateway naming its language, so
admission detects nothing again; the groups run concurrently, and the answers are put back in order.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

import grpc

from protos.nmt.v1 import translator_pb2 as pb
from server.edge.gateway import Caller, CallFailed
from server.edge.http.context import Edge
from server.core.errors import ServiceError


@dataclass
class Translated:
    text: str
    source: str  # the language translated from
    confidence: Optional[float]  # of the detection; None when the caller named the language
    alternatives: list[str]


@dataclass
class Ask:
    texts: list[str]
    source: str  # "" = detect
    target: str
    html: bool = False
    split: int = pb.SPLIT_SENTENCES_ON
    alternatives: int = 0
    glossary_id: str = ""  # a glossary of the caller's key (server/glossary/); needs `source`
    background: bool = False  # PRIORITY_BACKGROUND (a document file's texts)


async def translate(edge: Edge, ask: Ask, caller: Caller) -> list[Translated]:
    """Raises CallFailed (INVALID_ARGUMENT when a text is confidently in a language nobody serves)."""
    if ask.source:
        groups = {ask.source: list(range(len(ask.texts)))}
        confidence: list[Optional[float]] = [None] * len(ask.texts)
    else:
        try:
            found = await edge.admission.sources_of(ask.texts, ask.target, ask.html)
        except ServiceError as e:
            raise CallFailed(grpc.StatusCode[e.code], str(e)) from None
        groups, confidence = {}, []
        for i, (language, score) in enumerate(found):
            groups.setdefault(language, []).append(i)
            confidence.append(score)
    calls = [_call(edge, ask, source, [ask.texts[i] for i in members], caller)
             for source, members in groups.items()]
    answers = await asyncio.gather(*calls)
    out: list[Optional[Translated]] = [None] * len(ask.texts)
    for (source, members), response in zip(groups.items(), answers):
        for i, translation in zip(members, response.translations):
            texts = [h.text for h in translation.hypotheses]
            out[i] = Translated(texts[0] if texts else "", source, confidence[i], texts[1:])
    return out


async def _call(edge: Edge, ask: Ask, source: str, texts: list[str], caller: Caller) -> pb.TranslateResponse:
    request = pb.TranslateRequest(texts=texts, source_language=source, target_language=ask.target,
                                  split_sentences=ask.split, mime_type="text/html" if ask.html else "")
    if ask.alternatives:
        request.options.alternatives = ask.alternatives + 1  # the translation itself, then its alternatives
    request.glossary_id = ask.glossary_id
    request.priority = pb.PRIORITY_BACKGROUND if ask.background else pb.PRIORITY_INTERACTIVE
    return await edge.gateway.unary("Translate", request, caller)
