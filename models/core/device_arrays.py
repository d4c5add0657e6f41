"""Arrays on the decoding device: numpy on the host, CuPy on a CUDA device, one set of operations.

The slot cache (models/core/kv_cache.py) is written by slicing: a new row's cross keys/values, a
finished row's slot refilled by the last row, beam rows reordered. CuPy arrays take the same slicing and
fancy indexing as numpy's, and run it as kernels on the device, so the cache's code is the same on both;
what differs is here: where the memory comes from, its address for ONNX Runtime's IO binding, and
bringing an encoder output the device already holds into the same kind of array without a copy.

Measured reason (docs/benchmarks/gpu/README.md, an H200): with the cache in host memory the device
step's inputs and outputs crossed the bus every step and the host gathered every row's past, so the
server did 17% of what ONNX Runtime alone did on the device. CuPy is the field's library for device
arrays with numpy's interface (the GPU image carries it; the `gpu` extra installs it); ONNX Runtime's
own OrtValue has no slicing or copies between parts of a tensor.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=1)
def device_count() -> int:
    """CUDA devices CuPy sees; 0 without CuPy, a driver or a device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 (not installed, no driver, no device: the host cache it is)
        return 0


def device_arrays_available() -> bool:
    """CuPy installed and a CUDA device visible: the slot cache can live on the device."""
    return device_count() > 0


def device_zeros(shape: tuple[int, ...], dtype, device_id: int = 0) -> Any:
    """Zeros on CUDA device `device_id` (a cupy.ndarray)."""
    import cupy
    with cupy.cuda.Device(device_id):
        return cupy.zeros(shape, dtype=dtype)


def device_of(array: Any) -> tuple[str, int]:
    """ONNX Runtime's name and id of the device holding the array."""
    return ("cpu", 0) if isinstance(array, np.ndarray) else ("cuda", array.device.id)


def address(array: Any) -> int:
    """Where the array's first element is, for IO binding by pointer (host or device memory)."""
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr


def array_module(array: Any):
    """numpy for host arrays, cupy for device ones: code written against it runs where the array is."""
    if isinstance(array, np.ndarray):
        return np
    import cupy
    return cupy


def settle(array: Any) -> None:
    """Wait until the device work on the array's device is done: CuPy writes the cache on its own stream and
    ONNX Runtime reads it on another, so a step must not start before the writes end (nothing on the host)."""
    if not isinstance(array, np.ndarray):
        import cupy
        with cupy.cuda.Device(array.device.id):
            cupy.cuda.runtime.deviceSynchronize()


def to_host(array: Any) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.get()


def host_float32(array: Any) -> np.ndarray:
    """The array on the host in float32, what the host's token choice reads: no copy for a host float32
    array (the chooser then works on the step's own buffer, as it always did)."""
    return np.asarray(to_host(array), dtype=np.float32)


def same_device(like: Any, array: Any) -> Any:
    """`array` where `like` is: a host array copied to the device for a device cache (a new row's cross
    keys/values from an encoder that ran on the host, beam indices), anything else as it is."""
    if isinstance(like, np.ndarray) or not isinstance(array, np.ndarray):
        return array
    import cupy
    return cupy.asarray(array)


def as_device_array(value: Any) -> Any:
    """An ONNX Runtime output left on the CUDA device (OrtValue) as a CuPy array over the same memory,
    no copy; the array keeps the OrtValue alive. Host arrays pass through."""
    import onnxruntime as ort
    if not isinstance(value, ort.OrtValue):
        return value
    if value.device_name().lower() == "cpu":
        return value.numpy()
    import cupy
    dtype = _ORT_DTYPES[value.data_type()]
    shape = tuple(value.shape())
    nbytes = int(np.prod(shape)) * dtype.itemsize
    memory = cupy.cuda.UnownedMemory(value.data_ptr(), nbytes, value)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


_ORT_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16),
               "tensor(int64)": np.dtype(np.int64), "tensor(int32)": np.dtype(np.int32)}
