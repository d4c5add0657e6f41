import os
from pathlib import Path

import pytest

# The layers (docs/testing.md): tests/unit (no server, no ONNX session, no subprocess: `make test-fast`),
# tests/integration (ONNX graphs, export, importers, training), tests/system (a real server, real
# tools). tests/ is a package: pytest puts the repository root on the import path, so tests import
# their helpers as tests.serving, tests.tiny_models ... and the harness as benchmarks.harness; the
# project's own packages come from the editable install (`pip install -e .`).
UNIT_LAYER = Path(__file__).resolve().parent / "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if UNIT_LAYER in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.unit)

# Servers the tests start as processes bind their HTTP port (default 8080) to any free port instead:
# several run at once, and 8080 may be taken on a developer's machine.
os.environ.setdefault("NMT_HTTP_PORT", "0")

# Under NMT_REQUIRE_TOOLS=1 (set by .ci/run) a skipped test is a failed test: missing data
# (../shared/data), a missing extra (ctranslate2, transformers...) or a missing tool (promtool,
# nginx, haproxy) must not pass CI as a quiet skip. Only what CI's machine may not have may skip:
# a CUDA device, a Docker daemon, and a CPU with VNNI (the 8-bit `int8-vnni` weights are exact and
# served only there; CI runs on whatever x86 machine it is given, AVX2-only ones included: a clone
# on a 2-core AMD EPYC without VNNI failed four such tests before this line named it).
MAY_SKIP = ("CUDA", "Docker daemon", "no base image", "with VNNI")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("NMT_REQUIRE_TOOLS") != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(allowed in reason for allowed in MAY_SKIP):
        report.outcome = "failed"
        report.longrepr = f"skipped under NMT_REQUIRE_TOOLS=1, which allows skips only for {MAY_SKIP}: {reason}"


@pytest.fixture(scope="module")
def shipped_server():
    """The shipped models with default settings, one server per test module that asks for it."""
    from tests.serving import ServerThread
    srv = ServerThread().start()
    yield srv
    srv.stop()


@pytest.fixture
def start_server():
    """Start in-process servers (tests/serving.py ServerThread) with the settings a test needs:
    `srv = start_server(lame_duck_s=30)`. Each is stopped when the test ends, failed or not."""
    from tests.serving import ServerThread
    started = []

    def start(**settings):
        srv = ServerThread(**settings).start()
        started.append(srv)
        return srv
    yield start
    for srv in reversed(started):
        srv.stop()
