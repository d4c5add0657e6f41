"""One weights file per variant, shared by its graphs: each tensor stored once.

A bundle variant has three graphs over mostly the same parameters: the
encoder and both decoder graphs hold the (tied) embedding, and the two decoder
graphs hold every decoder weight. Stored inline, the fp32 bundle of the
default model was 57 MB for 26 MB of distinct tensors. `share_weights` moves
every sizeable initializer into ONNX external data (`weights[.variant].bin`
beside the graphs) and points identical tensors of different graphs at the
same bytes, so the graphs' `.onnx` files keep only the structure. A variant may also point at tensors another
variant's file holds already (int8's fp32 embedding and norms are fp32's own bytes in weights.bin).

ONNX Runtime reads external data relative to the graph's folder, so a bundle
stays relocatable. Offsets are aligned to 4 KiB so the runtime may map the file
instead of reading it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Sequence

import onnx
from onnx.external_data_helper import set_external_data

MIN_BYTES = 1024  # small tensors (biases of shapes, scalars) stay inline
ALIGN = 4096


Index = dict  # (dtype, dims, sha256) -> (file name, offset, length)


def share_weights(graphs: Sequence[Path], weights: Path, stored: Optional[Index] = None) -> tuple[int, int, Index]:
    """Move the initializers of `graphs` into `weights`, deduplicated; a tensor already in `stored` (another
    variant's weights file, written before in the same folder) is pointed at there instead. Returns (bytes
    before, bytes written, the index of both)."""
    index: Index = dict(stored or {})
    before = 0
    with open(weights, "wb") as blob:
        for path in graphs:
            model = onnx.load(str(path))
            for init in model.graph.initializer:
                if init.data_location == onnx.TensorProto.EXTERNAL:
                    raise ValueError(f"{path.name}: {init.name} already stored outside the graph")
                raw = onnx.numpy_helper.to_array(init).tobytes()
                if len(raw) < MIN_BYTES:
                    continue
                before += len(raw)
                key = (init.data_type, tuple(init.dims), hashlib.sha256(raw).hexdigest())
                if key not in index:
                    offset = (blob.tell() + ALIGN - 1) // ALIGN * ALIGN
                    blob.seek(offset)
                    blob.write(raw)
                    index[key] = (weights.name, offset, len(raw))
                location, offset, length = index[key]
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    init.ClearField(field)
                init.raw_data = raw  # set_external_data insists on raw_data, then it goes
                set_external_data(init, location=location, offset=offset, length=length)
                init.ClearField("raw_data")
                init.data_location = onnx.TensorProto.EXTERNAL
            onnx.save(model, str(path))
        after = blob.tell()
    return before, after, index
