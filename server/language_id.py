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
                from py3langid.langid import MODEL_FILE, LanguageIdentifier as Model
                self._model = Model.from_model_file(MODEL_FILE, norm_probs=True)
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
