"""Corpora, normalisation, and token-count batching. Imports no torch.

Two corpora:
  * Multi30k task 1 raw (train / val / test_2016_flickr in en, de, fr), pinned
    to upstream commit a3d2e0d; checksums are of the gunzipped files.
  * Tatoeba English-French (manythings.org 2019-04-07 release, 167,130 pairs);
    no official split, so we split by English sentence (hash-based, stable).

`--data-dir` points at a local copy (files named as upstream, gunzipped);
without it the files are downloaded once into a cache and verified.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from models.core.tokenizer import normalize  # noqa: F401 (the corpus text rule; re-exported)

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_URL = f"https://github.com/multi30k/dataset/raw/{MULTI30K_COMMIT}/data/task1/raw/{{name}}.gz"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS = ("en", "de", "fr")
MULTI30K_SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
}
TATOEBA_URL = "http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip"
TATOEBA_MEMBER = "fra-eng/fra.txt"
TATOEBA_FILE = "fra-eng.tsv"
TATOEBA_SHA256 = "0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104"
TATOEBA_SPLITS = ("train", "val", "test")

@dataclass(frozen=True)
class Pair:
    src: str
    tgt: str


class ChecksumError(RuntimeError):
    pass


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("NMT_DATA_CACHE", Path.home() / ".cache" / "nmt-serve" / "data"))


def _verified(name: str, data: bytes, expected: str, origin: str) -> bytes:
    got = sha256_of(data)
    if got != expected:
        raise ChecksumError(f"{name} from {origin}: sha256 {got} != expected {expected}")
    return data


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 (fixed https/http URLs)
        return resp.read()


def multi30k_file(name: str, data_dir: Optional[Path] = None, cache_dir: Optional[Path] = None) -> str:
    """Text of one Multi30k file (e.g. 'train.en'), checksum-verified."""
    if name not in MULTI30K_SHA256:
        raise KeyError(f"unknown Multi30k file {name!r}")
    if data_dir is not None:
        path = Path(data_dir) / name
        if not path.exists():
            raise FileNotFoundError(f"{path} not found (expected gunzipped upstream files in --data-dir)")
        return _verified(name, path.read_bytes(), MULTI30K_SHA256[name], str(path)).decode("utf-8")
    cache = Path(cache_dir or default_cache_dir()) / "multi30k"
    path = cache / name
    if path.exists():
        return _verified(name, path.read_bytes(), MULTI30K_SHA256[name], str(path)).decode("utf-8")
    url = MULTI30K_URL.format(name=name)
    data = _verified(name, gzip.decompress(_fetch(url)), MULTI30K_SHA256[name], url)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return data.decode("utf-8")


def tatoeba_text(data_dir: Optional[Path] = None, cache_dir: Optional[Path] = None) -> str:
    if data_dir is not None:
        path = Path(data_dir) / TATOEBA_FILE
        return _verified(TATOEBA_FILE, path.read_bytes(), TATOEBA_SHA256, str(path)).decode("utf-8")
    path = Path(cache_dir or default_cache_dir()) / "tatoeba" / TATOEBA_FILE
    if not path.exists():
        with zipfile.ZipFile(io.BytesIO(_fetch(TATOEBA_URL))) as zf:
            data = _verified(TATOEBA_FILE, zf.read(TATOEBA_MEMBER), TATOEBA_SHA256, TATOEBA_URL)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return _verified(TATOEBA_FILE, path.read_bytes(), TATOEBA_SHA256, str(path)).decode("utf-8")


def _lines(text: str) -> list[str]:
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def tatoeba_split_of(english: str) -> str:
    """Stable split by English sentence: ~2% test, ~2% val, the rest train."""
    bucket = int(hashlib.md5(normalize(english).encode("utf-8")).hexdigest()[:8], 16) % 100
    return "test" if bucket < 2 else "val" if bucket < 4 else "train"


def load_pairs(corpus: str, split: str, src_lang: str, tgt_lang: str,
               data_dir: Optional[str | Path] = None, cache_dir: Optional[Path] = None) -> list[Pair]:
    """Normalised sentence pairs; pairs with an empty side are dropped."""
    data_dir = Path(data_dir) if data_dir is not None else None
    if corpus == "multi30k":
        if split not in MULTI30K_SPLITS:
            raise ValueError(f"Multi30k split must be one of {MULTI30K_SPLITS}, got {split!r}")
        src = _lines(multi30k_file(f"{split}.{src_lang}", data_dir, cache_dir))
        tgt = _lines(multi30k_file(f"{split}.{tgt_lang}", data_dir, cache_dir))
        if len(src) != len(tgt):
            raise ValueError(f"{split}.{src_lang} has {len(src)} lines, {split}.{tgt_lang} has {len(tgt)}")
        rows = zip(src, tgt)
    elif corpus == "tatoeba":
        if split not in TATOEBA_SPLITS or {src_lang, tgt_lang} != {"en", "fr"}:
            raise ValueError("Tatoeba offers en<->fr with splits train/val/test")
        rows = []
        for line in _lines(tatoeba_text(data_dir, cache_dir)):
            en, fr = line.split("\t")[:2]
            if tatoeba_split_of(en) == split:
                rows.append((en, fr) if src_lang == "en" else (fr, en))
    else:
        raise ValueError(f"unknown corpus {corpus!r} (multi30k or tatoeba)")
    pairs = [Pair(normalize(s), normalize(t)) for s, t in rows]
    return [p for p in pairs if p.src and p.tgt]


def token_batches(src_lens: Sequence[int], tgt_lens: Sequence[int], max_tokens: int,
                  shuffle: bool = True, seed: int = 0, max_sentences: int = 1024) -> list[list[int]]:
    """Group example indices into batches of at most `max_tokens` padded tokens.

    Examples are sorted by length (with random tie-breaking when shuffling) so
    each batch holds similar lengths and little padding; the batch order is
    then shuffled. Padded cost = rows * longest side, counted for both sides.
    """
    rng = random.Random(seed)
    noise = [rng.random() if shuffle else 0.0 for _ in src_lens]
    order = sorted(range(len(src_lens)), key=lambda i: (tgt_lens[i], src_lens[i], noise[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        size = max(src_lens[i], tgt_lens[i])
        if batch and (max(longest, size) * (len(batch) + 1) > max_tokens or len(batch) >= max_sentences):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, size)
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches
