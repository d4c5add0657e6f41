"""Serve Hugging Face models directly: import each `--model` once into a cache, then serve the cached bundles.

    prepare_repository(["./opus-mt-en-de", "Helsinki-NLP/opus-mt-en-fr"], default_cache_dir()) -> repository

Each model (a local directory, or a hub id) is imported by the existing importer,
`python -m export --from-huggingface`, with every one of its checks: a model that fails one is
not served, and the importer's problems are the error. The import runs in a subprocess because
the serving runtime imports no torch or transformers (a serve-only install has neither, and
loading them would cost the server ~1 GB of memory it never uses again); only the child needs the
`export` extra, and only when something must be imported: reusing the cache needs neither.

Cache layout (the default directory: default_cache_dir()):

    imports/<name>-<key>/1/     one imported bundle; <key> hashes the source (a directory's resolved
                                path and its files' names, sizes and mtimes; a hub id and its revision)
    served/<hash>/<name> ->     the repository handed to discover(): relative links to imports/, one
                                folder per list of models, so servers started with other lists coexist
    tmp/<key>.<random>/         imports in progress; renamed into imports/ only when the importer exits 0
    locks/<key>.lock            flock: one process imports a source, the others wait and reuse its result
"""
from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from models.core.bundle import BUNDLE_FORMAT

LOG = logging.getLogger(__name__)
EXPORT_EXTRA = ("torch", "transformers", "onnx")  # what `python -m export --from-huggingface` imports
INSTALL_HINT = "the importer needs the export extra: pip install 'nmt-serve[export]'"
# The files the importer reads (export/huggingface.py, HUB_FILES, and transformers' tokenizer files);
# a README or a .git folder changing must not cost a re-import.
MODEL_FILES = ("*.json", "*.safetensors", "*.bin", "*.spm", "*.model")
PROJECT_ROOT = Path(__file__).resolve().parents[1]  # holds the `export` package in a checkout


class ImportFailed(RuntimeError):
    """A model could not be imported; the message holds the importer's problems, one per line."""

    def __init__(self, source: str, problems: Sequence[str]):
        super().__init__(f"cannot serve {source}:\n" + "\n".join(f"  - {p}" for p in problems))
        self.source, self.problems = source, list(problems)


@dataclass(frozen=True)
class Source:
    arg: str  # as the user wrote it
    name: str  # the bundle's (served model's) name
    spec: str  # what the importer is given: an absolute directory or a hub id
    key: str  # imports/<key>: changes whenever the import would
    hub: bool  # a hub id (else a local directory)
    offline: bool  # a hub id whose snapshot is cached: the importer must not touch the network


def default_cache_dir() -> Path:
    """$NMT_CACHE_DIR, else $XDG_CACHE_HOME/nmt-serve, else ~/.cache/nmt-serve."""
    if os.environ.get("NMT_CACHE_DIR"):
        return Path(os.environ["NMT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "nmt-serve"


def bundle_name(text: str) -> str:
    """A model name from a directory or hub id's last part: lowercase, [a-z0-9._-] only."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.rstrip("/").rsplit("/", 1)[-1].lower()).strip(".-")
    return name or "model"


def hub_snapshot(repo_id: str) -> Optional[Path]:
    """The cached snapshot of a hub id's main revision, read from huggingface_hub's documented cache
    layout (models--org--name/refs/main -> snapshots/<commit>/) so that no hub library is needed here."""
    root = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not root:
        home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
            "huggingface"
        root = Path(home) / "hub"
    repo = Path(root).expanduser() / ("models--" + repo_id.replace("/", "--"))
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if (snapshot / "config.json").is_file() else None


def describe(arg: str, export_args: Sequence[str] = ()) -> Source:
    """Name and cache key of one --model argument, without importing anything."""
    h = hashlib.sha256(f"{BUNDLE_FORMAT}\0{' '.join(export_args)}\0".encode())
    for value in export_args:  # a file the importer reads (--calibration-text): a new version is a new import
        if os.path.isfile(value):
            st = os.stat(value)
            h.update(f"\0{value}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    path = Path(arg).expanduser()
    if path.is_dir():
        path = path.resolve()
        # A directory inside the hub cache is named by its commit: take the repository's name instead.
        label = path.parent.parent.name.split("--")[-1] if path.parent.name == "snapshots" else path.name
        h.update(str(path).encode())
        for f in sorted(path.iterdir()):
            if f.is_file() and any(fnmatch.fnmatch(f.name, p) for p in MODEL_FILES):
                st = f.stat()  # follows the hub cache's links to its blobs
                h.update(f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        name = bundle_name(label)
        return Source(arg, name, str(path), f"{name}-{h.hexdigest()[:16]}", False, False)
    if path.exists() or arg.startswith((".", "/", "~")) or arg.count("/") != 1:  # export's resolve() rule
        raise ImportFailed(arg, ["not a directory with a Hugging Face model, nor a hub id like "
                                 "Helsinki-NLP/opus-mt-en-de"])
    snapshot = hub_snapshot(arg)
    h.update(f"hub:{arg}@{snapshot.name if snapshot else 'unresolved'}".encode())
    name = bundle_name(arg)
    return Source(arg, name, arg, f"{name}-{h.hexdigest()[:16]}", True, snapshot is not None)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        yield


def _problems(lines: Sequence[str]) -> list[str]:
    """The importer's report ('  - problem' lines after its summary line), else its last lines."""
    missing = [m for line in lines for m in re.findall(r"No module named '([\w.]+)'", line)]
    if any(m.split(".")[0] in EXPORT_EXTRA + ("huggingface_hub",) for m in missing):
        return [f"no module {missing[0]}: {INSTALL_HINT}"]
    items = [line[4:] for line in lines if line.startswith("  - ")]
    return items or [line for line in lines if line.strip()][-15:] or ["the importer exited without a message"]


def _run_importer(src: Source, out: Path, export_args: Sequence[str], log: logging.Logger) -> None:
    """python -m export --from-huggingface into `out`; its output goes to the log line by line."""
    missing = [m for m in EXPORT_EXTRA if importlib.util.find_spec(m) is None]  # finds, never imports
    if missing:
        raise ImportFailed(src.arg, [f"{', '.join(missing)} not installed; {INSTALL_HINT}"])
    path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    if src.offline:
        env["HF_HUB_OFFLINE"] = "1"  # the revision the key names, from the hub cache, with no network
    cmd = [sys.executable, "-m", "export", "--from-huggingface", src.spec, "--out", str(out / "repo"),
           "--name", src.name, "--version", "1", *export_args]
    tail: deque[str] = deque(maxlen=200)
    # cwd: the temp dir, so nothing in the user's directory shadows the `export` package.
    with subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True, errors="replace") as proc:
        try:
            for line in proc.stdout:  # tqdm's \r updates arrive as lines too (universal newlines)
                if not line.strip():
                    continue
                tail.append(line.rstrip("\n"))
                log.info("import %s: %s", src.name, tail[-1], extra={"event": "import_output", "model": src.name})
            status = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): stop the child too; its temp dir goes below
                proc.kill()
                proc.wait()
    if status != 0:
        raise ImportFailed(src.arg, _problems(list(tail)))


def ensure_imported(src: Source, cache_dir: Path, export_args: Sequence[str] = (),
                    log: logging.Logger = LOG) -> Path:
    """imports/<key>/ for one source: reused when there, else imported now (atomically)."""
    imports, tmp_root = cache_dir / "imports", cache_dir / "tmp"
    final = imports / src.key
    if (final / "1" / "config.json").is_file():
        log.info("reusing %s (imported earlier: %s)", src.name, final, extra={"event": "import_reused",
                                                                              "model": src.name})
        return final
    with _locked(cache_dir / "locks" / f"{src.key}.lock"):
        if (final / "1" / "config.json").is_file():  # another process imported it while we waited
            log.info("reusing %s (imported by another process)", src.name,
                     extra={"event": "import_reused", "model": src.name})
            return final
        tmp_root.mkdir(parents=True, exist_ok=True)
        for stale in tmp_root.glob(f"{src.key}.*"):  # left by a crashed import; the lock says none is running
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f"{src.key}.", dir=tmp_root))
        try:
            log.info("importing %s from %s", src.name, src.arg, extra={"event": "import_started",
                                                                       "model": src.name, "source": src.arg})
            start = time.monotonic()
            _run_importer(src, work, export_args, log)
            if src.hub and not src.offline:
                # A hub id fetched just now: key it by the revision it got, which the next start resolves offline.
                src = describe(src.arg, export_args)
                final = imports / src.key
            imports.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(work / "repo" / src.name, final)  # atomic; fails only onto an existing import
            except OSError:
                if not (final / "1" / "config.json").is_file():
                    raise
            took = time.monotonic() - start
            log.info("imported %s in %.1f s", src.name, took, extra={"event": "import_done", "model": src.name,
                                                                      "seconds": round(took, 1)})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def prepare_repository(models: Sequence[str], cache_dir: Path | None = None, export_args: Sequence[str] = (),
                       log: logging.Logger = LOG) -> Path:
    """A model repository (for discover()) serving exactly `models`, each imported once into `cache_dir`.

    models: local directories holding a Hugging Face model, or hub ids; export_args: extra importer flags
    (e.g. --int8), part of the cache key. Raises ImportFailed naming the first model that cannot be imported.
    """
    cache_dir = Path(cache_dir or default_cache_dir()).expanduser().resolve()
    sources: dict[str, Source] = {}
    for arg in models:
        src = describe(arg, export_args)
        if src.name in sources and sources[src.name].key != src.key:
            raise ImportFailed(arg, [f"its model name {src.name!r} is also {sources[src.name].arg}'s; "
                                     "serve them from directories with different names"])
        sources[src.name] = src
    if not sources:
        raise ImportFailed("--model", ["no model given"])
    links = {name: ensure_imported(src, cache_dir, export_args, log) for name, src in sources.items()}
    digest = hashlib.sha256("\n".join(f"{n}={p.name}" for n, p in sorted(links.items())).encode()).hexdigest()
    served = cache_dir / "served" / digest[:16]

    def complete() -> bool:
        return all((served / n / "1" / "config.json").is_file() for n in links)
    if complete():  # no lock, no write: a cache prepared beforehand may be mounted read-only
        return served
    served.parent.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / "locks" / "served.lock"):
        if not complete():
            shutil.rmtree(served, ignore_errors=True)  # absent, or a link's import was deleted by hand
            stage = Path(tempfile.mkdtemp(prefix=f".{served.name}.", dir=served.parent))
            for name, target in links.items():
                # Relative links: the cache stays valid when mounted elsewhere (a container volume).
                (stage / name).symlink_to(Path("..", "..", "imports", target.name))
            os.rename(stage, served)
    return served
