"""Which language a text is in, for requests that name no source language, and which served one to use.

The identifier is py3langid (langid.py's model, 97 languages, numpy only: it installs wherever
the server does, loads in well under a second and classifies a sentence in tens of
microseconds); docs/benchmarks/language_id.md compares it with lingua and langdetect on the
test sentences of every language the shipped models serve.

Routing (`route`): a short or ambiguous text is often scored a little higher in some language
nobody serves ("Hello!" looks Dutch or Frisian to any character model), so the answer is the
most likely *served* source language unless the text is confidently in an unserved one (top
probability at least `CONFIDENT`, measured on the same data); only then is the request refused,
with an error that names the served pairs.
"""
from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence

CONFIDENT = 0.8  # an unserved language at least this likely refuses the text (docs/benchmarks/language_id.md)
MAX_CHARS = 2000  # enough to decide; a 50,000-character document costs no more than this
_TAG = re.compile(r"<[^>]*>|&[#\w]+;")


@dataclass(frozen=True)
class Detection:
    language: str  # ISO 639-1 (or -3 where there is no -1 code), as the identifier names it
    confidence: float  # its probability among the identifier's languages, in [0, 1]
    ranked: tuple[tuple[str, float], ...]  # every language, most likely first


class LanguageIdentifier:
    """Thread-safe after construction (classification reads the model only); built on first use."""

    def __init__(self) -> None:
        self._model = None
        self._lock = threading.Lock()

    def _identifier(self):
        with self._lock:
            if self._model is None:
                from py3langid.langid import MODEL_FILE
                self._model = compact_model(MODEL_FILE)
            return self._model

    def warm(self) -> None:
        self._identifier()

    def detect(self, text: str, html: bool = False) -> Detection:
        sample = _TAG.sub(" ", text[: MAX_CHARS * 2]) if html else text
        ranked = tuple((lang, float(p)) for lang, p in self._identifier().rank(sample[:MAX_CHARS]))
        return Detection(ranked[0][0], ranked[0][1], ranked)

    def detect_all(self, texts: Sequence[str], html: bool = False) -> Detection:
        """One detection for several texts of one request (they are translated with one model)."""
        joined, size = [], 0
        for text in texts:
            if size >= MAX_CHARS:
                break
            joined.append(text[:MAX_CHARS - size])
            size += len(joined[-1])
        return self.detect("\n".join(joined), html)


def route(detection: Detection, served: Sequence[str]) -> Optional[str]:
    """The served source language to translate from, or None when the text is confidently in a language
    none of `served` is."""
    if detection.language in served:
        return detection.language
    if detection.confidence >= CONFIDENT:
        return None
    likely = dict(detection.ranked)
    return max(served, key=lambda lang: likely.get(lang, 0.0)) if served else None


# -- the model, in half the memory ------------------------------------------------------------------------
FAR = 0xFFFF  # a transition to a state numbered past 16 bits: looked up in the exceptions instead


def compact_model(model_file: str):
    """py3langid's identifier with its byte automaton stored in 16 bits a transition, same answers.

    Measured problem (docs/memory.md): the identifier was the frontend's largest holder, 73 MB resident,
    and 39 MB of that is the automaton's transition table: 38,346 rows of 256 next states in 32 bits,
    because its 104,583 states do not fit 16. Almost every transition goes to a few states, though:
    numbered by how many transitions enter them, the first 65,535 states take all but 39,048 of the 9.8
    million. So the table keeps 16-bit state numbers in that order, FAR marks the 39,048 others, and
    two sorted arrays hold those (tests/unit/test_language_id.py: the same ranking as py3langid's own
    on every test sentence and on random text). One more comparison per byte; ~20 MB less in every
    frontend, and 9 MB more with the per-state tables as flat arrays rather than lists of int objects
    (loaded and 600 texts classified: +70.0 -> +61.0 MB, same answers, same time)."""
    from array import array
    from bisect import bisect_left

    import numpy as np
    from py3langid.langid import LanguageIdentifier as Model

    from models.core.heap import release_free_heap

    class Compact(Model):
        __slots__ = ("_next16", "_far_at", "_far_to", "_start", "_row_of", "_feature_of")

        def _raw_score(self, text):  # py3langid's visit_counts over the compact table
            next16, far_at, far_to = self._next16, self._far_at, self._far_to
            row_of, feature_of = self._row_of, self._feature_of
            state, found = self._start, []
            for byte in text:
                at = row_of[state] + byte
                state = next16[at]
                if state == FAR:
                    state = far_to[bisect_left(far_at, at)]
                feature = feature_of[state]
                if feature >= 0:
                    found.append(feature)
            if found:
                return self._sparse_score(Counter(found), self.nb_ptc)
            return super()._raw_score(b"")  # no features: the library's own answer for that case

    model = Compact.from_model_file(model_file, norm_probs=True)
    table = np.frombuffer(model.tk_nextmove, dtype=np.uint32 if model.tk_nextmove.itemsize == 4 else np.uint16)
    states = len(model.tk_row)
    order = np.argsort(-np.bincount(table, minlength=states), kind="stable")  # most entered first
    number = np.empty(states, dtype=np.int64)
    number[order] = np.arange(states)
    renumbered = number[table]
    far_at = np.flatnonzero(renumbered >= FAR)  # ascending: bisect finds a transition's place
    # Flat arrays, not a dict and lists of Python ints: 28 bytes an int object plus 8 a list slot
    # against 8 in an array, ~9 MB less for the same lookups (a bisect only on the rare far transition).
    model._far_at = array("q", far_at.tobytes())
    model._far_to = array("q", renumbered[far_at].astype(np.int64).tobytes())
    renumbered[far_at] = FAR
    model._next16 = array("H", renumbered.astype(np.uint16).tobytes())
    model._start = int(number[0])
    model._row_of = array("q", (int(model.tk_row[old]) << 8 for old in order.tolist()))
    model._feature_of = array("q", (model.tk_output[old] for old in order.tolist()))
    # The 32-bit table and the library's per-state lists are not used any more: drop them.
    model.tk_nextmove = model.tk_row = model.tk_output = model._rowbase = None
    del table, renumbered
    release_free_heap()  # the load's temporaries (the 32-bit table, the renumbering): ~5 MB more back
    return model
