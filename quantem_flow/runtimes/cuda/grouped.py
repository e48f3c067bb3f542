"""Frame passes on payloads decoded on the device a group of frames at a time.

``packed`` (and any representation with a device decoder) is decoded into a
reusable dense device buffer of about :data:`GROUP_BYTES`, then the fused
dense kernel runs on it; per-frame outputs are concatenated and the patterns
combined (integer sums exactly, maxima with NaN propagation).  A whole chunk
is never decoded at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import DtypeError
from ..base import FramePassResult

__all__ = ["GROUP_BYTES", "frame_pass_packed_cuda", "grouped_frame_pass"]

GROUP_BYTES = 64 * 2**20
_UNPACK = {
    np.dtype(np.uint8): "qf_unpack_u8",
    np.dtype(np.uint16): "qf_unpack_u16",
    np.dtype(np.uint32): "qf_unpack_u32",
    np.dtype(np.int16): "qf_unpack_i16",
    np.dtype(np.int32): "qf_unpack_i32",
}


def grouped_frame_pass(
    n_frames: int,
    frame_size: int,
    dtype: np.dtype[Any],
    decode: Callable[[int, int, Any], None],
    weights: np.ndarray,
    *,
    want_sum: bool,
    want_max: bool,
) -> FramePassResult:
    """Decode groups of frames with ``decode(f0, f1, out)`` and run the dense pass on each."""
    import cupy

    from .. import get_runtime  # at call time: the package imports this module

    rt = get_runtime("cuda")
    group = max(1, GROUP_BYTES // max(frame_size * dtype.itemsize, 1))
    buffer = cupy.empty((min(group, max(n_frames, 1)), frame_size), dtype=dtype)
    per_frame: list[np.ndarray] = []
    total: np.ndarray | None = None
    peak: np.ndarray | None = None
    if n_frames == 0:
        empty: FramePassResult = rt.frame_pass(
            buffer[:0], weights, want_sum=want_sum, want_max=want_max
        )
        return empty
    for f0 in range(0, n_frames, group):
        f1 = min(n_frames, f0 + group)
        view = buffer[: f1 - f0]
        decode(f0, f1, view)
        out = rt.frame_pass(view, weights, want_sum=want_sum, want_max=want_max)
        per_frame.append(out.per_frame)
        if out.pattern_sum is not None:
            total = out.pattern_sum.copy() if total is None else total + out.pattern_sum
        if out.pattern_max is not None:
            peak = out.pattern_max.copy() if peak is None else np.maximum(peak, out.pattern_max)
    return FramePassResult(np.concatenate(per_frame), total, peak)


def frame_pass_packed_cuda(
    payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Frame pass on a packed payload, unpacked on the device group by group."""
    import cupy

    from . import _module

    dtype = np.dtype(payload.value_dtype).newbyteorder("=")
    entry = _UNPACK.get(dtype)
    if entry is None:
        raise DtypeError(
            f"the CUDA packed decoder writes u8/u16/u32/i16/i32 frames, the payload holds "
            f"{dtype}; use backend='cpu' for it"
        )
    data = cupy.asarray(payload.data, dtype=cupy.uint32)
    widths = cupy.asarray(payload.widths, dtype=cupy.uint8)
    offsets = cupy.asarray(payload.offsets, dtype=cupy.int64)
    k = int(payload.frame_shape[0]) * int(payload.frame_shape[1])
    n = int(payload.scan_shape[0]) * int(payload.scan_shape[1])
    kernel = _module("packed.cu").get_function(entry)
    block = int(payload.block_values)

    def decode(f0: int, f1: int, out: Any) -> None:
        count = (f1 - f0) * k
        threads = 256
        grid = min((count + threads - 1) // threads, 65535 * 4)
        kernel(
            (max(grid, 1),),
            (threads,),
            (
                data,
                widths,
                offsets,
                np.int64(f0),
                np.int64(f1 - f0),
                np.int64(k),
                np.int32(block),
                out,
            ),
        )

    return grouped_frame_pass(n, k, dtype, decode, weights, want_sum=want_sum, want_max=want_max)
