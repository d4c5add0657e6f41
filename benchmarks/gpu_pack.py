"""Pack what a GPU session needs into parts small enough to carry, one part per call.

    python -m benchmarks.gpu_pack [--wheel onnxruntime_gpu-...whl] [--arch 90] [--part-mb 60]
        [--out .gpupack]

Measured problem: the device tool carries at most 64 MiB a call (working tree and carried files
together), and onnxruntime-gpu's wheel is 256 MB, 284 MB of it the CUDA provider library with kernels
for sm_75, 80, 86, 89, 90 and 120. A GPU lease is 15 minutes, so nothing can be built there.

Design: the provider library's kernels sit in fatbinary containers (magic 0xBA55ED50), one entry per
architecture; the driver loads the entry for the device's architecture and never reads the others.
Blanking the payload of every other architecture's entry (zeros, headers left as they are) leaves a
library that loads and runs on that architecture and compresses to a quarter (ORT 1.31.1: 70 MB of
xz for package, sm_90 only). The parts also hold the serving dependencies the device's image lacks
(wheels for its Python 3.12, pure-Python packages copied from here where PyPI has no wheel), an fp16
export of the shipped model, and the test sentences, then the whole is split to fit the calls.

Before the calls, make the tracked tree small (the bundles and checkpoints are ~100 MB):
`git rm -r -q --cached model_repository models/pretrained` and add both to .git/info/exclude;
`git reset -q` afterwards restores the index (the files never leave the disk). README.txt in the
output folder lists the calls. A part's folder is named in `carry`; files written outside the
repository (/tmp) survive between calls while the machine stays warm (30 s after a call).
"""
from __future__ import annotations

import argparse
import lzma
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
# The device image lacks these (docs: the device library's KINDS.md package list); versions as installed here.
SERVING_WHEELS = ("grpcio grpcio-health-checking grpcio-reflection grpcio-status googleapis-common-protos protobuf "
                  "python-json-logger starlette uvicorn py3langid pycountry pyzmq msgspec sentencex python-multipart "
                  "defusedxml python-docx python-pptx translate-toolkit polib XlsxWriter").split()
NO_WHEEL = ("odf", "srt.py")  # sdist-only on PyPI: pure Python, copied from this environment
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64"]


def keep_one_arch(library: bytes, arch: int) -> tuple[bytearray, int]:
    """Zero the payload of every fatbinary entry not built for `arch`; -> (library, bytes zeroed)."""
    out = bytearray(library)
    zeroed = 0
    at = out.find(FATBIN_MAGIC)
    while at != -1:
        _, header, size = struct.unpack_from("<HHQ", out, at + 4)
        entry, end = at + header, at + header + size
        while entry < end:
            _, _, entry_header, payload = struct.unpack_from("<HHIQ", out, entry)
            entry_arch = struct.unpack_from("<I", out, entry + 28)[0]
            if entry_arch != arch:
                start = entry + entry_header
                out[start:start + payload] = bytes(payload)
                zeroed += payload
            entry += entry_header + payload
        at = out.find(FATBIN_MAGIC, max(end, at + 1))
    return out, zeroed


def pip_version(name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pip", "show", name], capture_output=True, text=True).stdout
    return next((line.split()[1] for line in out.splitlines() if line.startswith("Version:")), "")


def pack_runtime(wheel: Path, arch: int, into: Path) -> None:
    """The onnxruntime package of `wheel`, one architecture's kernels, as into/onnxruntime.tar.xz."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
        capi = Path(tmp) / "onnxruntime" / "capi"
        (capi / "libonnxruntime_providers_tensorrt.so").unlink(missing_ok=True)
        provider = capi / "libonnxruntime_providers_cuda.so"
        kept, zeroed = keep_one_arch(provider.read_bytes(), arch)
        provider.write_bytes(kept)
        print(f"  provider library: {zeroed / 1e6:.0f} of {len(kept) / 1e6:.0f} MB blanked (not sm_{arch})", flush=True)
        with lzma.open(into / "onnxruntime.tar.xz", "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
            for path in sorted(Path(tmp).iterdir()):
                tar.add(path, arcname=path.name)


def pack_dependencies(into: Path) -> None:
    wheels = into / "wheels"
    wheels.mkdir()
    versions = {name: pip_version(name) for name in SERVING_WHEELS}  # one `pip show` each
    specs = [f"{name}=={v}" if v else name for name, v in versions.items()]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp",
                    *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(wheels), *specs], check=True)
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    pure = into / "site"
    pure.mkdir()
    for name in NO_WHEEL:
        src = site / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, pure / name)


def pack_model(into: Path) -> None:
    subprocess.run([sys.executable, "-m", "export", "--checkpoint",
                    str(ROOT / "models/pretrained/multi30k-en-de-small/model.pt"),
                    "--out", str(into / "model_repository"), "--fp16"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    (into / "data").mkdir()
    shutil.copy(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en", into / "data")


SETUP = """#!/bin/bash
# First call (carry this part): dependencies into /tmp/site, the model and the test sentences in place.
S=/tmp/site; mkdir -p $S
python3 -m pip install -q --no-index --no-deps --no-compile --target $S {part}/wheels/*.whl
cp -r {part}/site/* $S/
cp {part}/runtime.xz.* /tmp/ 2>/dev/null
mkdir -p ../shared/data/multi30k && cp {part}/data/* ../shared/data/multi30k/
mkdir -p /tmp/model_repository && cp -r {part}/model_repository/* /tmp/model_repository/
LD=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({{os.path.dirname(f) for p in nvidia.__path__ \
    for f in glob.glob(p + '/**/lib*.so*', recursive=True)}})))")
# Every later call starts with `source /tmp/gpu_env.sh`: the tree is synced again at each call, /tmp is not.
cat > /tmp/gpu_env.sh <<E
export PYTHONUNBUFFERED=1 PYTHONPATH=$S LD_LIBRARY_PATH=$LD
rm -rf model_repository && cp -r /tmp/model_repository model_repository
E
"""
RUN = """#!/bin/bash
# Later calls (carry their part): its runtime piece to /tmp; the last one puts the runtime together.
cp {part}/runtime.xz.* /tmp/
source /tmp/gpu_env.sh
test -d /tmp/site/onnxruntime || ! test -f /tmp/runtime.xz.{last:02d} || cat /tmp/runtime.xz.* | xz -d | tar -x -C /tmp/site
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheel", required=True, help="onnxruntime-gpu wheel for cp312 (pip download ... onnxruntime-gpu)")
    p.add_argument("--arch", type=int, default=90, help="the GPU's compute capability x 10 (90: H100, H200)")
    p.add_argument("--part-mb", type=float, default=60.0, help="most MB a part may hold (64 MiB less the tracked tree, ~5 MB slimmed)")
    p.add_argument("--out", default=str(ROOT / ".gpupack"), help="folder of the parts (add it to .git/info/exclude)")
    args = p.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    staging = out / "staging"
    staging.mkdir(parents=True)
    print("packing onnxruntime ...", flush=True)
    pack_runtime(Path(args.wheel), args.arch, staging)
    print("dependencies and model ...", flush=True)
    pack_dependencies(staging)
    pack_model(staging)
    # Part 1: everything but the runtime, then as much runtime as fits; the rest in parts of --part-mb.
    limit = int(args.part_mb * 1e6)
    first = out / "part1"
    first.mkdir()
    for name in ("wheels", "site", "model_repository", "data"):
        shutil.move(str(staging / name), first / name)
    used = sum(f.stat().st_size for f in first.rglob("*") if f.is_file())
    runtime = (staging / "onnxruntime.tar.xz").read_bytes()
    chunks = [runtime[:max(0, limit - used)]]
    rest = runtime[len(chunks[0]):]
    chunks += [rest[i:i + limit] for i in range(0, len(rest), limit)]
    for n, chunk in enumerate(chunks, 1):
        part = out / f"part{n}"
        part.mkdir(exist_ok=True)
        (part / f"runtime.xz.{n:02d}").write_bytes(chunk)
        (part / ("setup.sh" if n == 1 else "run.sh")).write_text(
            (SETUP if n == 1 else RUN).format(part=f"{out.name}/part{n}", last=len(chunks)))
    shutil.rmtree(staging)
    calls = [f"call {n}: carry {out.name}/part{n}; command `bash {out.name}/part{n}/{'setup' if n == 1 else 'run'}.sh"
             + ("; source /tmp/gpu_env.sh; python3 -m benchmarks.gpu_suite --only ...`" if n == len(chunks) else "`")
             for n in range(1, len(chunks) + 1)]
    (out / "README.txt").write_text("\n".join(calls) + "\nthen, in each later call (no carry): `source /tmp/gpu_env.sh; "
                                    "python3 -m benchmarks.gpu_suite --only ...`\n")
    for line in calls:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
