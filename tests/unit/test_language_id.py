"""The language identifier's compact automaton (server/frontend/language_id.py compact_model) answers exactly as
py3langid's own model: the same ranking, every language and probability, on the test sentences of the
shipped languages, on random text across Unicode, and on the edge cases (empty, spaces, no features)."""
from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest
from py3langid.langid import MODEL_FILE, LanguageIdentifier as Model

from server.frontend.language_id import FAR, LanguageIdentifier, compact_model

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"


@pytest.fixture(scope="module")
def models():
    return compact_model(MODEL_FILE), Model.from_model_file(MODEL_FILE, norm_probs=True)


def texts() -> list[str]:
    out = []
    for lang in ("en", "de", "fr"):
        out += (DATA / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:300]
    rng = random.Random(0)
    out += ["".join(chr(rng.randrange(1, 0x30000)) for _ in range(rng.randrange(0, 60))) for _ in range(500)]
    return out + ["", " ", "Hello!", "123 456", "ÄÖÜ äöü ß", "日本語のテキスト", "Привет, мир"]


def test_the_same_ranking_as_py3langid(models):
    compact, reference = models
    for text in texts():
        assert compact.rank(text) == reference.rank(text), text


def test_the_table_is_16_bit_with_few_exceptions(models):
    compact, _ = models
    assert compact._next16.itemsize == 2 and compact.tk_nextmove is None
    far = sum(1 for state in compact._next16 if state == FAR)
    assert far == len(compact._far_at) == len(compact._far_to) and far < 0.01 * len(compact._next16)
    assert list(compact._far_at) == sorted(compact._far_at)  # bisect's precondition
    # Flat arrays, not Python lists of int objects (~9 MB of the identifier's 70)
    assert all(isinstance(a, array) for a in (compact._row_of, compact._feature_of, compact._far_at, compact._far_to))


def test_the_server_identifier_uses_it():
    detection = LanguageIdentifier().detect("Ein Mann fährt mit dem Fahrrad durch den Park.")
    assert detection.language == "de" and detection.confidence > 0.5
