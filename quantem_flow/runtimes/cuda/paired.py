"""The CUDA frame pass on electron-counted pairs (``paired.cu``), O(events)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import DtypeError, ParameterError
from ..base import FramePassResult

__all__ = ["frame_pass_paired_cuda"]

WARPS_PER_BLOCK = 8
_INDEX = {np.dtype(np.uint16): "i16", np.dtype(np.uint32): "i32"}
_COUNT = {np.dtype(np.uint8): "c8", np.dtype(np.uint16): "c16", np.dtype(np.uint32): "c32"}


def frame_pass_paired_cuda(
    payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Run the paired frame pass on the current CUDA device.

    The payload's arrays may already be CuPy arrays (resident) or host
    arrays (uploaded here).  Sums are uint64 on the device and returned as
    int64; the max pattern is uint32 on the device, returned in the
    payload's value dtype (pixels without events are 0, as in dense data).
    """
    import cupy

    from . import MAX_RAW_WEIGHTS, _module

    require = getattr(payload, "require_applied", None)
    if callable(require):
        require()
    idx_dt, cnt_dt = np.dtype(payload.indices.dtype), np.dtype(payload.counts.dtype)
    if idx_dt not in _INDEX or cnt_dt not in _COUNT:
        raise DtypeError(
            f"the CUDA paired kernel takes uint16/uint32 indices and uint8/16/32 counts, got "
            f"{idx_dt} indices and {cnt_dt} counts; use backend='cpu' for this payload"
        )
    n = int(payload.indptr.shape[0]) - 1
    k = int(payload.frame_shape[0]) * int(payload.frame_shape[1])
    w = np.ascontiguousarray(weights, dtype=np.float64).reshape(-1, k)
    m = int(w.shape[0])
    if not np.all(np.isfinite(w)):
        raise ParameterError(
            "the CUDA paired kernel needs finite weights (a non-finite weight on a pixel without "
            "events would make the dense result NaN but not the sum over events); operators "
            "never produce such weights; check the mask passed"
        )
    if m > MAX_RAW_WEIGHTS:
        raise ParameterError(
            f"the CUDA paired kernel takes at most {MAX_RAW_WEIGHTS} weight rows per pass, got "
            f"{m}; split the masks or use backend='cpu'"
        )
    indptr = cupy.asarray(payload.indptr, dtype=cupy.int64)
    indices = cupy.asarray(payload.indices)
    counts = cupy.asarray(payload.counts)
    per_frame = cupy.zeros((n, m), dtype=cupy.float64)
    psum = cupy.zeros(k, dtype=cupy.uint64)
    pmax = cupy.zeros(k, dtype=cupy.uint32)
    d_w = cupy.asarray(w if m else np.zeros((1, 1)), dtype=cupy.float64)
    if n:
        kernel = _module("paired.cu").get_function(
            f"qf_paired_pass_{_INDEX[idx_dt]}_{_COUNT[cnt_dt]}"
        )
        threads = 32 * WARPS_PER_BLOCK
        kernel(
            ((n + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK,),
            (threads,),
            (
                indptr,
                indices,
                counts,
                np.int64(n),
                np.int64(k),
                d_w,
                np.int32(m),
                per_frame,
                psum,
                pmax,
                np.int32(want_sum),
                np.int32(want_max),
            ),
        )
    cupy.cuda.Device().synchronize()
    value_dtype = np.dtype(payload.dtype)
    out_sum = cupy.asnumpy(psum).view(np.int64) if want_sum else None
    out_max = None
    if want_max:
        if n == 0:
            out_max = np.full(k, np.iinfo(value_dtype).min, dtype=value_dtype)
        else:
            out_max = cupy.asnumpy(pmax).astype(value_dtype)
    return FramePassResult(cupy.asnumpy(per_frame), out_sum, out_max)
