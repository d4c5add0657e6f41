"""The GPU suite's plumbing on a machine without a GPU (benchmarks/gpu_suite.py --provider cpu --quick):
every step it can run here finishes and writes its files, the CUDA-only ones are skipped with the
reason, and README.md tabulates them. (The suite exists for the rare lent GPU: a broken import or
flag found there costs the lease.)"""
from __future__ import annotations

import subprocess
import sys

from tests.serving import ROOT


def test_the_suite_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "suite"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_suite", "--provider", "cpu", "--quick",
                           "--only", "test,static,ops,serve-fp32,serve-fp16,frontends", "--out-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    readme = (out / "README.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in readme.splitlines()
            if line.startswith("| ") and not line.startswith("| step") and not line.startswith("|---")}
    assert rows["static"] == rows["serve-fp32"] == rows["frontends-1"] == rows["frontends-2"] == "ok", readme
    assert rows["ops-attention"] == rows["ops-choice"] == rows["ops-inplace"] == "ok", readme
    assert "| fp32 | 8 |" in (out / "ops-inplace.log").read_text()
    assert "| 8 | 1,000 | yes |" in (out / "ops-choice.log").read_text()  # the choice checked, then timed
    assert rows["test"].startswith("skipped") and rows["serve-fp16"].startswith("skipped"), readme
    for name in ("device.json", "gpu_static.md", "serving_cpu_fp32.md", "frontends_1.md", "frontends_2.md",
                 "frontends.png"):
        assert (out / name).exists(), name
