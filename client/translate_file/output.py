"""The translated document, written once and whole: the document path's and --server-side's last step."""
from __future__ import annotations

import os
import sys


def write_output(data: bytes, output) -> None:
    """The translated file to standard output, or to `output` whole (written beside it, then renamed: a
    reader never sees half a file)."""
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    partial = output.with_name(output.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, output)
