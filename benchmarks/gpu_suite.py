"""Everything a GPU session should measure, in one command and in priority order (issue 21).

    python -m benchmarks.gpu_suite [--out-dir docs/benchmarks/gpu] [--only test,static,...]
        [--budget-s 1500] [--provider cuda] [--quick]

GPU machines are lent rarely and briefly (15 minutes of device time, 10 per command; carry the runtime
with `python -m benchmarks.gpu_pack`), so the steps
run most-important first, each in its own process with its own time limit; a step that fails, times
out or cannot run here is recorded with why, and the suite goes on. Every figure lands in one
folder, docs/benchmarks/gpu/ (the latest GPU run replaces the previous one there; earlier runs are in
git history), with the device's name, the versions and the command that made it:

  device      nvidia-smi, ONNX Runtime's providers and the versions (device.json)
  test        tests/integration/test_gpu.py: CUDA tokens = CPU tokens (test_gpu.log)
  static      benchmarks.gpu_static: ONNX Runtime alone, CPU fp32 vs CUDA fp32 / fp16, batch 1-256
  ops         benchmarks.studies: inplace_device (the step alone per cache shape and variant),
              cuda_graph_step (ops-graph: the step replayed as CUDA graphs vs plain, tokens checked),
              attention_ops (GQA fp16 vs opset-24 Attention) and choice_ops (greedy on the device vs host)
  serve-fp32  benchmarks.serving_load on the device, in-process and through gRPC, 1-256 streams, CUDA
              graphs on (the default); serve-fp32-copy: the copying step, the device cache's baseline;
              serve-fp32-nographs: without graphs, the graphs' baseline
  serve-fp16  the same in fp16
  serve-cpu   the same server on the host's CPU cores: the same-run baseline for "10x the CPU"
  frontends   --engine-core process --frontends 1, 2, 4, 8 over 64 connections (issue 22's scaling)
  marian      an OPUS-MT-shaped Marian (d_model 512, 6+6 layers, 58k vocabulary) imported and served on
              the device; marian-static: our static decoding of it; marian-torch: PyTorch's `generate`,
              the issue's baseline (all need torch and transformers; skipped without them)

README.md in the folder has a table of every step (status, seconds, command, files) and the
frontend-scaling plot, rewritten after each step (a session cut off keeps what it measured). On the
lent machine, whose commands stop at 10 minutes, run it in parts into one folder: `--only
device,test,static,ops`, then `--only serve-fp32,serve-fp16,serve-cpu`, then `--only frontends,marian`
(each part rewrites README.md with its own steps; keep the logs). `--provider cpu --quick` runs the same plumbing on a machine without a GPU
in a minute or two (what CI checks: tests/integration/test_gpu_suite.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from benchmarks.harness import date_line, machine, machine_line

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("device", "test", "static", "ops", "serve-fp32", "serve-fp32-copy", "serve-fp16", "serve-cpu", "frontends",
         "marian")  # "ops" and "marian" name families: ops-inplace, ops-graph, marian-static, ...


@dataclass
class Step:
    name: str
    command: list[str]
    files: list[str]
    timeout_s: float
    why_not: str = ""  # non-empty: skipped, and why
    prepare: Optional[Callable[[], None]] = None


@dataclass
class Outcome:
    name: str
    status: str  # ok | failed (rc N) | timed out | skipped: why
    seconds: float
    command: str
    files: list[str] = field(default_factory=list)


def device_facts(provider: str) -> dict:
    import onnxruntime as ort
    facts = {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
             "python": platform.python_version(), "onnxruntime": ort.__version__,
             "providers": ort.get_available_providers(), "provider_asked": provider}
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        facts["gpus"] = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return facts


def device_name(facts: dict) -> str:
    return facts["gpus"][0].split(",")[0] if facts.get("gpus") else f"no GPU ({facts['cpu']}, {facts['cores']} cores)"


def plan(args, out: Path, facts: dict) -> list[Step]:
    py = [sys.executable, "-m"]
    cuda = args.provider == "cuda"
    no_cuda = "" if not cuda or "CUDAExecutionProvider" in facts["providers"] else \
        "ONNX Runtime here has no CUDAExecutionProvider (install onnxruntime-gpu)"
    quick = args.quick
    streams = "1,8" if quick else "1,8,32,64,128,256"
    requests = "32" if quick else "512"
    load = [*py, "benchmarks.serving_load", "--concurrency", streams, "--requests", requests, "--repeats", "1",
            "--stream-intervals", "1", "--max-batch-size", "64" if quick else "256"]
    static = [*py, "benchmarks.gpu_static", "--out", str(out / "gpu_static.md")]
    static += ["--runs", "cpu:fp32", "--sentences", "16", "--cpu-batch-sizes", "1,8", "--tokens", "8"] if quick \
        else ["--runs", f"cpu:fp32,{args.provider}:fp32" + (",cuda:fp16" if cuda else "")]
    # The shipped bundle carries fp32 and int8 graphs; the fp16 serving step gets a copy with fp16 ones
    # (the conversion gpu_static makes for itself), the same checkpoint and tokenizer.
    fp16_repository = Path(tempfile.gettempdir()) / "gpu-suite-fp16-repository"  # not beside the results

    def with_fp16() -> None:
        from benchmarks.gpu_static import with_fp16 as convert
        from models.core.bundle import newest_version
        shutil.rmtree(fp16_repository, ignore_errors=True)
        bundle = newest_version(ROOT / "model_repository" / "multi30k-en-de-small")
        if convert(bundle, fp16_repository) == bundle:  # it has fp16 graphs already
            shutil.copytree(bundle, fp16_repository / bundle.parent.name / bundle.name)

    steps = [
        Step("test", [*py, "pytest", "-q", "-rs", "tests/integration/test_gpu.py"], ["test_gpu.log"], 600, no_cuda),
        Step("static", static, ["gpu_static.md", "gpu_static.json"], 600, no_cuda),
        # The decode-step issue's two open design questions, answered on this device: an attention op that
        # writes each row's cache in place (GQA in fp16 vs opset-24 Attention), and token choice on the
        # device vs the logits copied to the host (docs/benchmarks/choice_ops.md has the CPU's answer).
        # Served fp16 in place was 5x slower than fp32 on an H200 while the same graph in gpu_static was not:
        # the step alone at both cache shapes, and where ONNX Runtime placed its nodes.
        Step("ops-inplace", [*py, "benchmarks.studies.inplace_device", "--provider", args.provider]
             + (["--variants", "fp32", "--rows", "8", "--server-shape", "32,65,64"] if quick else []),
             ["ops-inplace.log"], 300, no_cuda),
        # The step replayed as a CUDA graph (one per row count) against launched node by node, fp32 and fp16.
        Step("ops-graph", [*py, "benchmarks.studies.cuda_graph_step", "--repository", str(fp16_repository)]
             + (["--rows", "1,8"] if quick else []),
             ["ops-graph.log"], 300, no_cuda or ("" if cuda else "CUDA graphs are for the CUDA provider"), with_fp16),
        Step("ops-attention", [*py, "benchmarks.studies.attention_ops", "--provider", args.provider,
                               "--dtype", "fp16" if cuda else "fp32"] + (["--capacity", "64"] if quick else []),
             ["ops-attention.log"], 300, no_cuda),
        # 8,000 (the shipped model) and 58,101 (OPUS-MT): the 256k vocabulary's host path alone took 5 of the
        # 6.5 minutes this step ran on an H200, and says nothing the other two do not.
        Step("ops-choice", [*py, "benchmarks.studies.choice_ops", "--provider", args.provider]
             + (["--rows", "8", "--vocab", "1000"] if quick else ["--vocab", "8000,58101"]),
             ["ops-choice.log"], 600, no_cuda),
        Step("serve-fp32", [*load, "--provider", args.provider, "--variant", "fp32",
                            "--out", str(out / f"serving_{args.provider}_fp32.md")],
             [f"serving_{args.provider}_fp32.md"], 600, no_cuda),
        # The same with the copying step (the cache in host memory): the device path's same-run baseline.
        Step("serve-fp32-copy", [*load, "--provider", args.provider, "--variant", "fp32", "--decoder", "copy",
                                 "--out", str(out / f"copying_step_{args.provider}_fp32.md")],
             [f"copying_step_{args.provider}_fp32.md"], 600, no_cuda or ("" if cuda else "the CPU has no device path")),
        # The server replays the step as CUDA graphs by default: the same without them, the graphs' baseline.
        Step("serve-fp32-nographs", [*load, "--provider", args.provider, "--variant", "fp32",
                                     "--server-flags=--cuda-graphs false",
                                     "--out", str(out / f"no_cuda_graphs_{args.provider}_fp32.md")],
             [f"no_cuda_graphs_{args.provider}_fp32.md"], 600,
             no_cuda or ("" if cuda else "CUDA graphs are for the CUDA provider")),
        Step("serve-fp16", [*load, "--provider", "cuda", "--variant", "fp16", "--repository", str(fp16_repository),
                            "--out", str(out / "serving_cuda_fp16.md")],
             ["serving_cuda_fp16.md"], 600, no_cuda or ("" if cuda else "fp16 is for the CUDA provider"), with_fp16),
        Step("serve-cpu", [*load, "--provider", "cpu", "--variant", "fp32", "--out", str(out / "serving_host_cpu.md")],
             ["serving_host_cpu.md"], 600, "" if cuda else "--provider cpu: serve-fp32 is already the CPU"),
    ]
    for n in ([1, 2] if quick else [1, 2, 4, 8]):
        steps.append(Step(f"frontends-{n}", [*load, "--provider", args.provider, "--variant", "fp32",
                                             "--engine-cores", "process", "--frontends", str(n),
                                             "--connections", "8" if quick else "64",
                                             "--out", str(out / f"frontends_{n}.md")],
                          [f"frontends_{n}.md"], 600, no_cuda))
    have_torch = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
    marian_hf, marian = out / "marian_hf", out / "marian_repository"
    no_torch = "" if have_torch else "needs torch and transformers to build the model"

    def build_marian() -> None:  # once, for whichever marian step runs first
        if (marian / "opus-mt-shaped").exists():
            return
        from benchmarks.hf_compare import OPUS_MT, build_model
        hf = build_model(Path(tempfile.mkdtemp()))
        shutil.copytree(hf, marian_hf, dirs_exist_ok=True)
        subprocess.run([*py, "export", "--from-huggingface", str(hf), "--out", str(marian), "--name", "opus-mt-shaped"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        print(f"  built an OPUS-MT-shaped Marian ({OPUS_MT['d_model']}, vocabulary {OPUS_MT['vocab_size']})",
              flush=True)
    # The imported model's target: served on the device >= 1.3x PyTorch generate with static batches of the
    # same size. The three figures, same sentences and 32 tokens a row: our static decoding, PyTorch's, served.
    batches = "8,32" if quick else "1,8,32,128"
    steps.append(Step("marian-static", [*py, "benchmarks.gpu_static", "--bundle", str(marian / "opus-mt-shaped" / "1"),
                                        "--runs", "cuda:fp32,cuda:fp16", "--sentences", "128", "--batch-sizes",
                                        batches, "--out", str(out / "marian_static.md")],
                      ["marian_static.md", "marian_static.json"], 600,
                      no_cuda or no_torch or ("" if cuda else "its runs are the CUDA provider's"), build_marian))
    steps.append(Step("marian-torch", [*py, "benchmarks.studies.marian_generate", "--hf-dir", str(marian_hf),
                                       "--batch-sizes", batches, "--out", str(out / "marian_torch.md")],
                      ["marian_torch.md", "marian_torch.json"], 600, no_cuda or no_torch, build_marian))
    # Random weights with EOS never chosen loop by design: the runaway guard would cut them short.
    # Fewer levels and requests than the shipped model's: every row decodes to the length limit (no EOS).
    marian_load = [*py, "benchmarks.serving_load", "--concurrency", "8" if quick else "8,32,128", "--requests",
                   "16" if quick else "128", "--max-seconds", "40", "--repeats", "1", "--stream-intervals", "1",
                   "--max-batch-size", "128"]
    steps.append(Step("marian", [*marian_load, "--provider", args.provider, "--variant", "fp32", "--repository", str(marian),
                                 "--server-flags=--runaway-guard false", "--out", str(out / "serving_marian.md")],
                      ["serving_marian.md"], 600, no_cuda or no_torch, build_marian))
    return steps


def run_step(step: Step, out: Path, deadline: float) -> Outcome:
    shown = " ".join(a if a != sys.executable else "python" for a in step.command)
    if step.why_not:
        return Outcome(step.name, f"skipped: {step.why_not}", 0.0, shown)
    left = deadline - time.monotonic()
    if left < 30:
        return Outcome(step.name, "skipped: the suite's time budget is spent", 0.0, shown)
    t0 = time.monotonic()
    log = out / f"{step.name}.log"
    try:
        if step.prepare is not None:
            step.prepare()
        with open(log, "w", encoding="utf-8") as f:
            proc = subprocess.run(step.command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=min(step.timeout_s, left))
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode}; see {log.name})"
    except subprocess.TimeoutExpired:
        status = f"timed out after {min(step.timeout_s, left):.0f} s"
    except Exception as e:  # noqa: BLE001 (a step's failure is recorded; the suite goes on)
        status = f"failed: {type(e).__name__}: {e}"
    if step.name == "test" and log.exists():
        shutil.copy(log, out / "test_gpu.log")
        if status == "ok" and " passed" not in log.read_text():  # pytest exits 0 when every test skips
            status = "skipped: every test skipped (no CUDA device or onnxruntime-gpu; see test_gpu.log)"
    return Outcome(step.name, status, time.monotonic() - t0, shown, [f for f in step.files if (out / f).exists()])


def scaling_plot(out: Path, outcomes: list[Outcome]) -> Optional[str]:
    """Peak gRPC tokens/s against the number of frontends, from the frontends-N runs that finished."""
    points = []
    for o in outcomes:
        data = out / f"frontends_{o.name.split('-')[-1]}.json"
        if o.name.startswith("frontends-") and o.status == "ok" and data.exists():
            levels = json.loads(data.read_text())["runs"][0]["grpc"]["levels"]
            points.append((int(o.name.split("-")[-1]), max(lv["tokens_per_s"] for lv in levels)))
    if len(points) < 2:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([n for n, _ in points], [t for _, t in points], "o-")
    ax.set_xlabel("frontend processes (--frontends)")
    ax.set_ylabel("peak tokens/s through gRPC")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "frontends.png", dpi=110)
    return "frontends.png"


def write_readme(out: Path, facts: dict, outcomes: list[Outcome], argv: Sequence[str], plot: Optional[str]) -> None:
    m = machine()
    lines = [f"# GPU suite: {device_name(facts)}, {m['date']}", "",
             f"Command: `python -m benchmarks.gpu_suite {' '.join(argv)}`", "",
             date_line(m), "",
             machine_line(f"GPUs: {', '.join(facts.get('gpus', [])) or 'none'}", m), "",
             f"Python {facts['python']}; onnxruntime {facts['onnxruntime']} ({', '.join(facts['providers'])}).",
             "", "| step | status | seconds | command | files |", "|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.status} | {o.seconds:.0f} | `{o.command}` | {', '.join(o.files) or '-'} |")
    if plot:
        lines += ["", f"![frontend scaling]({plot})"]
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", help="default docs/benchmarks/gpu (a fresh temporary folder with --quick, "
                                     "which checks the plumbing and measures nothing worth keeping)")
    p.add_argument("--provider", default="cuda", choices=["cuda", "cpu"], help="the device the steps measure")
    p.add_argument("--only", type=lambda s: s.split(","), help=f"steps to run, of {', '.join(STEPS)} "
                                                                "(frontends = every frontends-N)")
    p.add_argument("--budget-s", type=float, default=1500.0, help="stop starting steps after this long")
    p.add_argument("--quick", action="store_true", help="small settings: check the plumbing, not the speed")
    args = p.parse_args(argv)
    out = Path(args.out_dir or (tempfile.mkdtemp(prefix="gpu-suite-quick-") if args.quick
                                else ROOT / "docs/benchmarks/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    facts = device_facts(args.provider)
    (out / "device.json").write_text(json.dumps(facts, indent=1))
    print(f"GPU suite on {device_name(facts)} -> {out}", flush=True)
    outcomes = [Outcome("device", "ok", 0.0, "nvidia-smi; onnxruntime.get_available_providers()", ["device.json"])]
    for step in plan(args, out, facts):
        if args.only and not any(step.name == s or step.name.startswith(s + "-") for s in args.only):
            continue
        print(f"[{step.name}] ...", flush=True)
        outcomes.append(run_step(step, out, deadline))
        print(f"[{step.name}] {outcomes[-1].status} ({outcomes[-1].seconds:.0f} s)", flush=True)
        write_readme(out, facts, outcomes, argv, None)  # progress survives a cut-off session
    write_readme(out, facts, outcomes, argv, scaling_plot(out, outcomes))
    print((out / "README.md").read_text())
    return 0 if all(o.status == "ok" or o.status.startswith("skipped") for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
