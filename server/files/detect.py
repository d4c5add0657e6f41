"""A document's source language, when the uploader did not name it: the same rule for every file API.

    source = await document_source(admission, target, sample, hint)   # ServiceError when it cannot be served

The language identifier ranks the served sources on a sample of the document's text (its first 5,000
characters). A document that reads as the target language much more than as any served source (twice the
score) is refused rather than "translated" into itself; `hint` tells the caller how to insist.
"""
from __future__ import annotations

import asyncio

from server.core.errors import InvalidArgument


async def document_source(admission, target: str, sample: str, hint: str) -> str:
    served = admission.sources(target)
    if not sample.strip():  # nothing to read: the first served source (the file's text is blank anyway)
        return served[0] if served else ""
    found = await asyncio.get_running_loop().run_in_executor(admission.executor, admission.identifier.detect,
                                                             sample, False)
    ranked = dict(found.ranked)
    best = max((ranked.get(s, 0.0) for s in served), default=0.0)
    if ranked.get(target, 0.0) > 2 * best:
        raise InvalidArgument(f"Source and target language are the same: the document reads as {target.upper()!r} "
                              f"already ({hint} to translate it anyway)")
    return admission.source_of(found, target, "the document")
