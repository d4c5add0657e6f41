"""server/frontend/model_imports.py: a Hugging Face model imported once into a cache and served from it.

Real imports of a tiny MarianMT built here (tests/hf_models.py) through `python -m export` in a
subprocess; nothing is mocked. That the importer did not run again is shown without timing: the
imported folder keeps its inode and mtime, and the reuse also works in a process that cannot import
torch at all (site-packages off its path), where an attempt to import would fail.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.harness import ServerProcess, run_server
from models.core.bundle import discover, load_bundle
from server.frontend.model_imports import ImportFailed, bundle_name, default_cache_dir, describe, prepare_repository

ROOT = Path(__file__).resolve().parents[2]
LANGS = {("en", "xx"), ("en", "yy")}  # hf_models.build_marian's multi-target pairs

# Runs prepare_repository(argv[1:-1], cache=argv[-1]) with site-packages off sys.path: no torch,
# transformers or onnx can be found, as in a serve-only install. Prints what happened as JSON.
WITHOUT_SITE_PACKAGES = f"""
import json, logging, site, sys
sys.path[:] = [{str(ROOT)!r}] + [p for p in sys.path[1:] if p not in site.getsitepackages()
                                 + [site.getusersitepackages()]]
from importlib.util import find_spec
assert find_spec("torch") is None, "torch still importable"
logging.basicConfig(level=logging.INFO, format="%(event)s")
from server.frontend.model_imports import ImportFailed, prepare_repository
out = {{}}
try:
    out["repo"] = str(prepare_repository(sys.argv[1:-1], sys.argv[-1]))
except ImportFailed as e:
    out["error"] = str(e)
out["modules"] = sorted(m for m in ("torch", "transformers", "onnx", "huggingface_hub") if m in sys.modules)
print(json.dumps(out))
"""


class Events(logging.Handler):
    """The `event` of every record server.frontend.model_imports logs (import_started, import_done, import_reused...)."""

    def __init__(self, name: str):
        super().__init__()
        self.log = logging.getLogger(f"test_serve_hf.{name}")
        self.log.setLevel(logging.INFO)
        self.log.propagate = False
        self.log.addHandler(self)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", "") != "import_output":
            self.seen.append(record.event)


@pytest.fixture
def events(request):
    return Events(request.node.name)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")  # the importer's extra; the tiny model is built with it too
    pytest.importorskip("sentencepiece")
    from tests import hf_models
    # 20 training steps: these tests check the cache, not translation quality (test_huggingface.py does).
    return hf_models.build_marian(tmp_path_factory.mktemp("hf") / "Opus-MT_en-XX", steps=20)


@pytest.fixture(scope="module")
def first(hf_dir, tmp_path_factory):
    """The first start: hf_dir imported into an empty cache. (cache, repository, events)"""
    cache = tmp_path_factory.mktemp("cache")
    ev = Events("first")
    return cache, prepare_repository([str(hf_dir)], cache, log=ev.log), ev.seen


def without_site_packages(args: list[str], cwd: Path) -> tuple[dict, list[str]]:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_SITE_PACKAGES, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr.split()


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_import_then_discover_serves_the_model(first, hf_dir):
    cache, repo, seen = first
    assert seen == ["import_started", "import_done"]
    (bundle,) = discover(repo)
    assert bundle.name == "opus-mt_en-xx" and set(bundle.languages.pairs) == LANGS
    assert bundle.languages.target_rule == "source_prefix"
    assert bundle.config["imported_from"] == {"source": str(hf_dir), "model_type": "marian"}
    link = repo / bundle.name  # a relative link into imports/: the cache may be mounted elsewhere
    assert link.is_symlink() and not os.readlink(link).startswith("/")
    assert link.resolve().parent == cache / "imports" and repo.parent == cache / "served"
    assert entries(cache / "tmp") == []


def test_second_start_reuses_the_import_without_torch(first, hf_dir, tmp_path, events):
    cache, repo, _ = first
    (imported,) = (cache / "imports").iterdir()
    before = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in (imported, imported / "1" / "config.json")]
    out, logged = without_site_packages([str(hf_dir), str(cache)], tmp_path)
    assert out == {"repo": str(repo), "modules": []} and logged == ["import_reused"]
    assert prepare_repository([str(hf_dir)], cache, log=events.log) == repo
    assert events.seen == ["import_reused"]
    assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in (imported, imported / "1" / "config.json")] == before
    assert entries(cache / "imports") == [imported.name]


def test_without_the_export_extra_a_new_model_fails_naming_the_install(first, hf_dir, tmp_path):
    cache, _, _ = first
    copy = shutil.copytree(hf_dir, tmp_path / "another-model")
    out, logged = without_site_packages([str(copy), str(cache)], tmp_path)
    assert "pip install 'nmt-serve[export]'" in out["error"] and "torch" in out["error"]
    assert out["modules"] == [] and logged == ["import_started"]
    assert not any(name.startswith("another-model") for name in entries(cache / "imports"))


def test_edited_model_is_imported_again(first, hf_dir, events):
    cache, repo, _ = first
    weights = hf_dir / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    try:
        edited = prepare_repository([str(hf_dir)], cache, log=events.log)
    finally:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert events.seen == ["import_started", "import_done"] and edited != repo
    assert len(entries(cache / "imports")) == 2 and [b.name for b in discover(edited)] == ["opus-mt_en-xx"]
    # The mtime back as it was: the first import is the one that fits again.
    assert prepare_repository([str(hf_dir)], cache, log=events.log) == repo
    assert events.seen[-1] == "import_reused"


@pytest.mark.unit
def test_cache_key_follows_the_model_files_only(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "marian"}')
    key = describe(str(model)).key
    (model / "README.md").write_text("not read by the importer")
    assert describe(str(model)).key == key
    (model / "config.json").write_text('{"model_type": "marian", "d_model": 64}')
    edited = describe(str(model)).key
    assert edited != key
    assert describe(str(model), ["--int8"]).key != edited  # importer flags change what is imported
    moved = model.rename(tmp_path / "n")
    assert describe(str(moved)).key != edited  # the resolved path is part of the key


def test_invalid_model_fails_with_the_importers_problems_and_leaves_nothing(hf_dir, tmp_path, events):
    bad = tmp_path / "bert-base"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "bert"}))
    cache = tmp_path / "cache"
    with pytest.raises(ImportFailed) as failed:
        prepare_repository([str(bad)], cache, log=events.log)
    assert "unsupported architecture model_type='bert'" in str(failed.value)
    assert "no weights (model.safetensors or pytorch_model.bin)" in failed.value.problems
    assert events.seen == ["import_started"]
    assert entries(cache / "imports") == [] and entries(cache / "tmp") == [] and entries(cache / "served") == []


@pytest.mark.unit
def test_neither_a_directory_nor_a_hub_id_fails_before_anything_runs(tmp_path):
    for arg in ("no/such/dir", "./missing", "plain-name"):
        with pytest.raises(ImportFailed, match="nor a hub id"):
            prepare_repository([arg], tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.unit
def test_two_models_with_one_name_are_refused(tmp_path):
    for parent in ("a", "b"):
        (tmp_path / parent / "opus-mt-en-de").mkdir(parents=True)
    with pytest.raises(ImportFailed, match="model name 'opus-mt-en-de'"):
        prepare_repository([str(tmp_path / "a" / "opus-mt-en-de"), str(tmp_path / "b" / "opus-mt-en-de")],
                           tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.unit
def test_names_and_default_cache_dir(monkeypatch, tmp_path):
    assert bundle_name("Helsinki-NLP/opus-mt-en-de") == "opus-mt-en-de"
    assert bundle_name("/models/My Model (v2)/") == "my-model-v2"
    assert bundle_name("...") == "model"
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path / "nmt"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "nmt"
    monkeypatch.delenv("NMT_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "nmt-serve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "nmt-serve"


def test_hub_id_is_served_from_the_hub_cache_offline(hf_dir, tmp_path, monkeypatch, events):
    hub = tmp_path / "hub" / "models--test-org--Tiny-Opus"  # huggingface_hub's cache layout
    shutil.copytree(hf_dir, hub / "snapshots" / "c0ffee", ignore=shutil.ignore_patterns("_spm"))
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("c0ffee")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = prepare_repository(["test-org/Tiny-Opus"], tmp_path / "cache", log=events.log)
    (bundle,) = discover(repo)
    assert bundle.name == "tiny-opus" and bundle.config["imported_from"]["source"] == "test-org/Tiny-Opus"
    assert set(bundle.languages.pairs) == LANGS and events.seen == ["import_started", "import_done"]
    key = describe("test-org/Tiny-Opus").key
    shutil.copytree(hub / "snapshots" / "c0ffee", hub / "snapshots" / "beef01")
    (hub / "refs" / "main").write_text("beef01")
    assert describe("test-org/Tiny-Opus").key != key  # a new revision is a new import


def test_concurrent_starts_import_once(hf_dir, tmp_path, events):
    copy = shutil.copytree(hf_dir, tmp_path / "shared-model")
    cache, repos = tmp_path / "cache", []
    # flock locks belong to open files, so two threads exclude each other as two processes would.
    threads = [threading.Thread(target=lambda: repos.append(prepare_repository([str(copy)], cache, log=events.log)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(repos) == 2 and repos[0] == repos[1]
    assert sorted(events.seen) == ["import_done", "import_reused", "import_started"]
    assert len(entries(cache / "imports")) == 1 and load_bundle(repos[0] / "shared-model" / "1").name == "shared-model"


def test_a_killed_import_leaves_nothing_to_reuse(hf_dir, tmp_path, events):
    copy = shutil.copytree(hf_dir, tmp_path / "killed")
    cache = tmp_path / "cache"
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from server.frontend.model_imports import prepare_repository; " \
           f"prepare_repository([{str(copy)!r}], {str(cache)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # until the exporter has started writing its bundle
        while not list((cache / "tmp").glob("killed-*/bundle-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the import never started writing"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the server and its importer child, mid-import
        proc.wait()
    assert entries(cache / "imports") == [] and entries(cache / "tmp") != []
    repo = prepare_repository([str(copy)], cache, log=events.log)
    assert events.seen == ["import_started", "import_done"] and entries(cache / "tmp") == []
    assert [b.name for b in discover(repo)] == ["killed"]


def test_nmt_serve_model_serves_it_in_one_command(first, hf_dir, tmp_path):
    """`python -m server --model DIR --cache-dir C` (the nmt-serve entry point): the cached import is
    served over gRPC and HTTP; a model that fails its checks is never served (exit 2, problems named)."""
    import httpx
    cache, _, _ = first
    server = ServerProcess("--model", str(hf_dir), "--cache-dir", str(cache), "--log-format", "json",
                           metrics=False, http_port=0, pipe=True).launch()
    proc = server.proc
    try:
        http_port = None
        for line in proc.stdout:
            record = json.loads(line)
            if record.get("event") == "serving":
                http_port = record["http_port"]
                break
        assert http_port, "the server never reported serving"
        r = httpx.post(f"http://127.0.0.1:{http_port}/v1/translate",
                       json={"texts": ["a b c"], "targetLanguage": "xx"}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "opus-mt_en-xx"
    finally:
        proc.terminate()
        proc.wait(60)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "bert"}))
    failed = run_server("--model", str(broken), "--cache-dir", str(tmp_path / "c"), "--port", "0", "--http-port", "-1",
                        "--metrics-port", "-1", timeout=300)
    assert failed.returncode == 2 and "cannot serve" in failed.stderr


def test_an_int8_import_with_calibration_text_serves_int8_static(hf_dir, tmp_path, events):
    """`--model X --variant int8 --calibration-text F`: the import calibrates the int8-static graphs on F (what
    `--variant int8` then serves); the file is part of the cache key, so an edited file is a new import."""
    text = tmp_path / "calibration.en"
    text.write_text("a man rides a horse .\ntwo dogs play in the snow .\na child reads a book .\n")
    args = ["--int8", "--calibration-text", str(text)]
    cache = tmp_path / "cache"
    repo = prepare_repository([str(hf_dir)], cache, export_args=args, log=events.log)
    (bundle,) = discover(repo)
    assert {"int8", "int8-static"} <= set(bundle.variants)
    key = describe(str(hf_dir), args).key
    assert key != describe(str(hf_dir), ["--int8"]).key
    text.write_text("a woman sings .\n")
    assert describe(str(hf_dir), args).key != key
