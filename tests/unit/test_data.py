"""Corpus loading (local copy, download with checksum), normalisation, batching."""
import gzip
import http.server
import threading
from pathlib import Path

import pytest

from models import data
from models.data import ChecksumError, load_pairs, normalize, token_batches

pytestmark = pytest.mark.unit  # the fast layer: `make test-fast`

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "multi30k").exists(), reason="no ../shared/data here")


def test_normalize_whitespace_and_invisibles():
    assert normalize("  a\tb\u00a0c\u202fd\u2009e  ") == "a b c d e"
    assert normalize("soft\u00adhyphen zero\u200bwidth") == "softhyphen zerowidth"
    assert normalize("\u00a0 ") == ""


@needs_shared
def test_multi30k_local_copy_loads_and_is_normalised():
    train = load_pairs("multi30k", "train", "en", "de", SHARED / "multi30k")
    assert len(train) == 29000
    assert all(p.src == p.src.strip() and "  " not in p.src and "\t" not in p.tgt for p in train)
    assert train[0].src == "Two young, White males are outside near many bushes."
    test = load_pairs("multi30k", "test_2016_flickr", "en", "fr", SHARED / "multi30k")
    assert len(test) == 1000


@needs_shared
def test_tatoeba_split_is_by_english_sentence():
    splits = {s: load_pairs("tatoeba", s, "en", "fr", SHARED / "tatoeba-fra-eng") for s in data.TATOEBA_SPLITS}
    assert sum(len(v) for v in splits.values()) == 167130
    train_src = {p.src for p in splits["train"]}
    assert not train_src & {p.src for p in splits["test"]}
    assert 0.01 < len(splits["test"]) / 167130 < 0.03


def test_checksum_mismatch_is_reported(tmp_path):
    (tmp_path / "val.en").write_text("not the real file\n")
    with pytest.raises(ChecksumError, match="val.en"):
        data.multi30k_file("val.en", data_dir=tmp_path)


def test_missing_local_file_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="data-dir"):
        data.multi30k_file("val.de", data_dir=tmp_path)


def test_download_verifies_and_caches(tmp_path, monkeypatch):
    """The real download path against a loopback HTTP server serving .gz files."""
    content = {"val.en": b"A dog runs.\nTwo cats.\n", "val.de": "Ein Hund rennt.\nZwei\u00a0Katzen.\n".encode("utf-8")}
    served = tmp_path / "srv"
    served.mkdir()
    for name, body in content.items():
        (served / f"{name}.gz").write_bytes(gzip.compress(body))
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(served), **kw)

        def log_message(self, *a):
            hits.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        monkeypatch.setattr(data, "MULTI30K_URL", f"http://127.0.0.1:{port}/{{name}}.gz")
        monkeypatch.setitem(data.MULTI30K_SHA256, "val.en", data.sha256_of(content["val.en"]))
        monkeypatch.setitem(data.MULTI30K_SHA256, "val.de", data.sha256_of(content["val.de"]))
        pairs = load_pairs("multi30k", "val", "en", "de", cache_dir=tmp_path / "cache")
        assert [(p.src, p.tgt) for p in pairs] == [("A dog runs.", "Ein Hund rennt."), ("Two cats.", "Zwei Katzen.")]
        assert len(hits) == 2
        load_pairs("multi30k", "val", "en", "de", cache_dir=tmp_path / "cache")
        assert len(hits) == 2  # second load from the verified cache
        # A corrupted download is refused.
        monkeypatch.setitem(data.MULTI30K_SHA256, "val.fr", "0" * 64)
        (served / "val.fr.gz").write_bytes(gzip.compress(b"x\n"))
        with pytest.raises(ChecksumError):
            data.multi30k_file("val.fr", cache_dir=tmp_path / "cache")
        assert not (tmp_path / "cache" / "multi30k" / "val.fr").exists()
    finally:
        server.shutdown()


def test_token_batches_respect_budget_and_cover_everything():
    import random
    rng = random.Random(0)
    src = [rng.randint(1, 40) for _ in range(500)]
    tgt = [rng.randint(1, 40) for _ in range(500)]
    batches = token_batches(src, tgt, max_tokens=200, shuffle=True, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        assert len(b) * max(max(src[i], tgt[i]) for i in b) <= 200 or len(b) == 1
    # Bucketing: batches are length-homogeneous, so padding stays small.
    pad = sum(len(b) * max(tgt[i] for i in b) - sum(tgt[i] for i in b) for b in batches)
    assert pad / sum(tgt) < 0.15
    assert token_batches(src, tgt, 200, shuffle=True, seed=3) == batches  # seeded
    assert token_batches(src, tgt, 200, shuffle=True, seed=4) != batches


@needs_shared
def test_committed_fixture_is_the_head_of_the_test_set():
    from models.data import multi30k_file
    real = multi30k_file("test_2016_flickr.en", data_dir=SHARED / "multi30k").splitlines()
    fixture = (Path(__file__).parents[1] / "data" / "test_2016_flickr.head200.en").read_text(encoding="utf-8")
    assert fixture.splitlines() == real[:200]
