import os
import sys
from pathlib import Path

import pytest

# Tests import their helpers (tests/serving.py) and the project packages from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Servers the tests start as processes bind their HTTP port (default 8080) to any free port instead:
# several run at once, and 8080 may be taken on a developer's machine.
os.environ.setdefault("NMT_HTTP_PORT", "0")

# Under NMT_REQUIRE_TOOLS=1 (set by .ci/run) a skipped test is a failed test: missing data
# (../shared/data), a missing extra (ctranslate2, transformers...) or a missing tool (promtool,
# nginx, haproxy) must not pass CI as a quiet skip. Only what CI's machine cannot have may skip:
# a CUDA device and a Docker daemon (README: "Skipped tests" lists them with the command to run).
MAY_SKIP = ("CUDA", "Docker daemon", "no base image")


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
