"""The request messages' options -> the plain types admission and the engine take, and timings back.

One direction each: protobuf stops here (and in the servicer that calls these), and what goes past is
plain data (server/core/request.py DecodingParams, server/frontend/admission.py TranslateCall, the
documents' options). tests/unit/test_request_options.py holds every spelling of the decoding options
to the .proto's.
"""
from __future__ import annotations

import time
from typing import Optional

from protos.nmt.v1 import translator_pb2 as pb
from server.core.errors import InvalidArgument
from server.core.request import DecodingParams
from server.texts.plan import MIME_PLAIN, SPLIT_NEWLINES, SPLIT_OFF, SPLIT_ON, DocumentOptions
from server.frontend.admission import TranslateCall

SPLIT = {pb.SPLIT_SENTENCES_UNSPECIFIED: SPLIT_ON, pb.SPLIT_SENTENCES_ON: SPLIT_ON,
         pb.SPLIT_SENTENCES_OFF: SPLIT_OFF, pb.SPLIT_SENTENCES_NEWLINES: SPLIT_NEWLINES}


def document_options(split: int, mime_type: str) -> DocumentOptions:
    if split not in SPLIT:
        raise InvalidArgument(f"unknown split_sentences value {split}")
    return DocumentOptions(SPLIT[split], mime_type.strip().lower() or MIME_PLAIN)  # checked by admission


def decoding_params(o: pb.DecodingOptions) -> DecodingParams:
    return DecodingParams(
        beam_size=max(o.beam_size, 1),
        length_penalty=o.length_penalty if o.HasField("length_penalty") else 1.0,
        # 0 is proto3's "unset" for top_p; any other value, negative and NaN included, is checked as sent.
        temperature=o.temperature, top_k=o.top_k, top_p=o.top_p if o.top_p != 0 else 1.0,
        seed=o.seed if o.HasField("seed") else None,
        max_output_tokens=o.max_output_tokens, num_hypotheses=max(o.num_hypotheses, 1),
        # 0 is proto3's "unset" for the penalty: off, like 1.
        repetition_penalty=o.repetition_penalty if o.HasField("repetition_penalty") and o.repetition_penalty != 0
        else 1.0,
        no_repeat_ngram_size=o.no_repeat_ngram_size, min_output_tokens=o.min_output_tokens,
        no_unknown_token=o.no_unknown_token, target_prefix=o.target_prefix, alternatives=o.alternatives)


def translate_call(request, deadline: Optional[float]) -> TranslateCall:
    """A TranslateRequest or TranslateStreamRequest as admission's plain TranslateCall."""
    stream = isinstance(request, pb.TranslateStreamRequest)
    priority = pb.PRIORITY_INTERACTIVE if stream else request.priority
    if priority not in pb.Priority.values():
        raise InvalidArgument(f"priority {priority} is not PRIORITY_INTERACTIVE (0) or PRIORITY_BACKGROUND (1)")
    return TranslateCall(texts=([request.text] if request.text else []) if stream else list(request.texts),
                         params=decoding_params(request.options), model=request.model,
                         source_language=request.source_language, target_language=request.target_language,
                         options=document_options(request.split_sentences, request.mime_type),
                         scores=not stream and request.return_scores, stream=stream, deadline=deadline,
                         glossary_id=request.glossary_id,
                         glossary_entries=tuple((e.source, e.target) for e in request.glossary_entries),
                         background=priority == pb.PRIORITY_BACKGROUND)


def deadline_of(context) -> Optional[float]:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def timings(t) -> pb.Timings:
    s = t.seconds()
    return pb.Timings(queue_seconds=s["queue"], first_token_seconds=s["first_token"], total_seconds=s["total"])
