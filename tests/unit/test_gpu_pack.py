"""benchmarks/gpu_pack.py: blanking every other architecture's kernels in a CUDA library's fatbinaries.

A library is built here from fatbinary containers laid out as CUDA's are (a 16-byte container header
with magic 0xBA55ED50, then entries whose header says their kind, size and architecture), between
bytes that are not fatbinaries: only the payloads of entries for other architectures may change, and
they must become zeros (what compresses away); headers, the wanted entries and everything else stay.
"""
from __future__ import annotations

import struct

from benchmarks.gpu_pack import FATBIN_MAGIC, keep_one_arch

ENTRY_HEADER = 64  # the entry header's size in the libraries seen (ONNX Runtime 1.31.1's CUDA provider)


def entry(arch: int, payload: bytes) -> bytes:
    header = bytearray(ENTRY_HEADER)
    struct.pack_into("<HHIQ", header, 0, 2, 0x101, ENTRY_HEADER, len(payload))  # kind 2: an ELF cubin
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return FATBIN_MAGIC + struct.pack("<HHQ", 1, 16, len(body)) + body


def test_only_other_architectures_payloads_become_zeros():
    keep, drop, drop2 = b"sm90-kernel" * 20, b"sm80-kernel" * 30, b"sm120-kernel" * 10
    first = container(entry(80, drop), entry(90, keep), entry(120, drop2))
    second = container(entry(90, keep))  # a container built for sm_90 alone
    library = b"ELF-code-before" + first + b"\x00\x01code between" + second + b"trailer"
    out, zeroed = keep_one_arch(library, 90)
    assert len(out) == len(library) and zeroed == len(drop) + len(drop2)
    assert out.count(keep) == 2 and drop not in out and drop2 not in out
    assert out.startswith(b"ELF-code-before") and out.endswith(b"trailer") and b"\x00\x01code between" in out
    # the dropped payloads are zeros in place; every header is as it was
    at = library.index(drop)
    assert out[at:at + len(drop)] == bytes(len(drop))
    assert out[:at] == library[:at]


def test_a_library_without_fatbinaries_is_left_alone():
    library = b"no kernels here" * 100
    assert keep_one_arch(library, 90) == (bytearray(library), 0)
