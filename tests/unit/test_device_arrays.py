"""models/core/device_arrays.py on the host: where the device path's helpers meet numpy and ONNX Runtime.

The CuPy side runs in tests/integration/test_gpu.py on a device; here, what every CPU server goes
through: host arrays pass through untouched, an OrtValue in host memory becomes its numpy array, and
the address bound by pointer is the array's own."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from models.core.device_arrays import address, array_module, as_device_array, device_of, same_device, settle, to_host


def test_host_arrays_stay_host_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert as_device_array(a) is a and to_host(a) is a and same_device(a, a) is a and array_module(a) is np
    assert device_of(a) == ("cpu", 0) and address(a) == a.ctypes.data and address(a[1]) == a.ctypes.data + 16
    settle(a)  # nothing to wait for on the host


def test_an_ortvalue_in_host_memory_becomes_its_array():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = ort.OrtValue.ortvalue_from_numpy(a)
    np.testing.assert_array_equal(as_device_array(value), a)
