"""A translation request's glossary, from the request to the jobs and back to the response.

Admission (server/frontend/admission.py) calls `lookup` once a request is routed (the language pair is
then known), `literal` once its texts are split, and `attach` once its jobs are built; the service
(server/edge/servicer.py) calls `hits` with each text's translation. `literal` takes the sentences
that are one term and nothing else out of the model's work. Kept apart from admission so that
file only calls in.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from server.core.errors import InvalidArgument, NotFound, Unavailable
from server.glossary.entries import MAX_GLOSSARY_BYTES, GlossaryError, check_entries, tsv_bytes
from server.glossary.matching import Match, Matcher, appears, matcher_of, terms_for
from server.glossary.store import open_store
from server.observability import calls


@dataclass
class Found:
    """The dictionary a request uses: its matcher and the cache its term tokens are kept in."""
    matcher: Matcher
    cache: dict = field(default_factory=dict)


def _refused(e: GlossaryError, what: str):
    message = f"{what}: {e.message}" + (f" ({e.detail})" if e.detail else "")
    return NotFound(message) if e.status == 404 else InvalidArgument(message)


def lookup(admission, glossary_id: str, entries: Sequence[tuple[str, str]], source: str, target: str
           ) -> Optional[Found]:
    """The request's glossary for source -> target: a stored one of the caller's key, or inline entries.
    Raises INVALID_ARGUMENT / NOT_FOUND as a ServiceError."""
    if not glossary_id and not entries:
        return None
    metrics = admission.metrics
    try:
        if glossary_id and entries:
            raise GlossaryError(400, "glossary_id and glossary_entries cannot be combined")
        if glossary_id:
            store = getattr(admission, "glossaries", None) or open_store()
            dictionary = store.dictionary(calls.caller_key_id(), glossary_id, source, target)
            found = Found(matcher_of(dictionary), dictionary.compiled)
            result = "stored"
        else:
            checked = check_entries((s, t, i + 1) for i, (s, t) in enumerate(entries))
            if tsv_bytes(checked) > MAX_GLOSSARY_BYTES:
                raise GlossaryError(400, "Invalid glossary entries provided", "more than 10 MiB of entries")
            found, result = Found(Matcher(checked)), "inline"
    except GlossaryError as e:
        if metrics is not None:
            metrics.glossary_lookups.labels("refused").inc()
        raise _refused(e, "glossary_id" if glossary_id and not entries else "glossary_entries") from None
    except OSError as e:  # the store's file (a full disk, a permission changed)
        raise Unavailable(f"the glossary store cannot be read: {e}") from None
    if metrics is not None:
        metrics.glossary_lookups.labels(result).inc()
    return found


def literal(plans: Sequence, found: Found) -> list[list[Match]]:
    """A sentence that is one glossary term and nothing else (closing punctuation aside: "Apple",
    "Apple.") is the term's entry, not a task for the model: it becomes part of its document's layout,
    the target term in place of the source (DeepL answers "Apfel" for "Apple" with Apple -> Apfel).
    Changes the plans; returns each plan's matches so replaced."""
    out = []
    for plan in plans:
        taken = []
        for i, part in enumerate(plan.parts):
            if isinstance(part, str) or part.restore is not None:
                continue
            found_here = found.matcher.find(part.source)
            if len(found_here) != 1:
                continue
            m = found_here[0]
            head, tail = part.source[:m.start], part.source[m.end:]
            if head.strip() or tail.strip(" .!?…"):
                continue
            plan.parts[i] = head + m.target + tail
            taken.append(m)
        out.append(taken)
    return out


def attach(jobs: list, sentences: Sequence[str], found: Found, model, plans: Sequence,
           literals: Sequence[Sequence[Match]]) -> list[list[Match]]:
    """Give each job the terms its sentence calls for; returns each plan's matches (its literal sentences'
    and its jobs', the jobs being the plans' units in order)."""
    constraints, matches = terms_for(sentences, found.matcher, model.tok, model.bundle.spec.unk_id, found.cache)
    for job, terms in zip(jobs, constraints):
        job.terms = terms
    out, start = [], 0
    for plan, taken in zip(plans, literals):
        n = len(plan.units)
        out.append(list(taken) + [m for sentence in matches[start:start + n] for m in sentence])
        start += n
    return out


def hits(matches: Sequence[Match], translation: str, metrics=None) -> list[tuple[str, str, int, bool]]:
    """A text's glossary hits: (source, target, occurrences, applied) per entry found, in order of first
    occurrence; counted in nmt_glossary_terms_total."""
    order: dict[tuple[str, str], int] = {}
    for m in matches:
        order[(m.source, m.target)] = order.get((m.source, m.target), 0) + 1
    out = [(s, t, n, appears(t, translation)) for (s, t), n in order.items()]
    if metrics is not None:
        for *_, applied in out:
            metrics.glossary_terms.labels("applied" if applied else "missed").inc()
    return out
