"""CPU kernel of the fused frame pass on ``encoded`` payloads.

The payload stays compressed.  The pass walks its runs in scan order and
decodes one stored piece at a time (keeping a few recently decoded pieces,
at most 32 MiB, for chunks stored as scan tiles that the scan order
revisits).  It copies the frames it needs into a small reusable batch
buffer, applies the detector post-ops to the batch and runs the dense fused
Numba kernel (:mod:`quantem_flow.runtimes.cpu.kernels`) on it, or the
structured kernel for mask and moment rows
(:mod:`quantem_flow.runtimes.cpu.structure`, chosen once per pass), writing
straight into the pass's outputs.  The chunk is never decoded whole.

Results are bit-identical to the dense kernel on the decoded chunk:
batches hold a multiple of 4 frames and start at multiples of 4 from the
chunk's first frame, so the kernel groups frames exactly as the dense pass
does, and the sum and max accumulators are carried across batches (each
pixel's sum is added frame by frame in scan order, as in the dense pass).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ...representations.encoded import EncodedPayload, PieceCache
from ..base import FramePassResult
from .kernels import _fused, skip_zero_weights, sum_dtype
from .structure import analyse_weights, structured_pass

__all__ = ["BATCH_BYTES", "frame_pass_encoded"]

#: Decoded bytes of one batch of frames (rounded to a multiple of 4 frames).
BATCH_BYTES = 2 * 2**20


def _batch_frames(n: int, frame_nbytes: int) -> int:
    per = max(4, (BATCH_BYTES // max(frame_nbytes, 1)) // 4 * 4)
    return min(per, max(4, -(-n // 4) * 4))


def frame_pass_encoded(
    payload: EncodedPayload, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Run the fused pass on an encoded chunk, decoding piece by piece.

    Parameters
    ----------
    payload
        The encoded chunk (post-ops attached).
    weights
        ``(n_weights, k_r * k_c)`` weight rows over the frames *after* the
        post-ops.
    want_sum, want_max
        Also accumulate the sum / maximum pattern.

    Returns
    -------
    FramePassResult
        As the dense pass: per-frame dot products (float64), the sum pattern
        (int64 for integer data, float64 otherwise), the max pattern in the
        data's dtype.

    Raises
    ------
    CorruptChunkError
        If a piece does not decode; the message names it.
    """
    n = payload.n_frames
    okr, okc = payload.out_frame_shape
    k = okr * okc
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[1] != k:
        raise ShapeError(
            f"weights of shape {weights.shape} do not fit frames of {okr} x {okc} = {k} pixels; "
            "expected (n_weights, k_r * k_c) over the frames after detector transforms"
        )
    logical = payload.dtype
    work = np.dtype(np.float32) if logical == np.float16 else logical  # Numba lacks float16
    m = weights.shape[0]
    if m % 2:  # the fused kernel takes weight rows in pairs
        weights = np.concatenate([weights, np.zeros((1, k), dtype=np.float64)])
    out = np.empty((n, weights.shape[0]), dtype=np.float64)
    acc_sum = np.zeros(k if want_sum else 1, dtype=sum_dtype(work))
    if want_max:
        low = -np.inf if work.kind == "f" else int(np.iinfo(work.str).min)
        acc_max = np.full(k, low, dtype=work)
    else:
        acc_max = np.zeros(1, dtype=work)

    plan = analyse_weights(weights[:m], frame_shape=(okr, okc)) if m else None
    variant: dict[str, Any] = (
        plan.describe(work) if plan else {"variant": "fused", "why": "no weight rows"}
    )
    structured = plan is not None and variant["variant"] == "structured"
    if plan is not None and structured and plan.n_out > out.shape[1]:
        out = np.empty((n, plan.n_out), dtype=np.float64)  # moment rows' sums after the rows
    kr, kc = payload.frame_shape
    raw_dtype = payload.value_dtype.newbyteorder("=")
    batch_n = _batch_frames(n, kr * kc * raw_dtype.itemsize)
    batch = np.empty((batch_n, kr, kc), dtype=raw_dtype)
    ops = payload.post_ops
    done = 0  # frames passed to the kernel

    def flush(fill: int) -> None:
        nonlocal done
        frames: np.ndarray = batch[:fill]
        for op in ops:
            frames = op.apply(frames)
        flat = np.ascontiguousarray(frames, dtype=work).reshape(fill, k)
        part = out[done : done + fill]
        if plan is not None and structured:
            structured_pass(flat, plan, part, acc_sum, acc_max, do_sum=want_sum, do_max=want_max)
        else:
            _fused(flat, weights, part, acc_sum, acc_max, want_sum, want_max)
        skip_zero_weights(flat, weights, part, m)
        done += fill

    fill = 0
    cache = PieceCache(payload)
    sizes = payload.piece_frames
    for piece, first, count in payload.runs.tolist():
        if first == 0 and count == sizes[piece] <= batch_n - fill and cache.last_use(piece):
            # the whole piece, used once: decode straight into the batch
            cache.get(piece, out=batch[fill : fill + count])
            fill += count
            if fill == batch_n:
                flush(fill)
                fill = 0
            continue
        decoded = cache.get(piece)
        taken = 0
        while taken < count:
            c = min(count - taken, batch_n - fill)
            batch[fill : fill + c] = decoded[first + taken : first + taken + c]
            fill += c
            taken += c
            if fill == batch_n:
                flush(fill)
                fill = 0
    if fill:
        flush(fill)
    assert done == n, f"internal error: {done} of {n} frames passed"
    peak: Any = acc_max.astype(logical) if want_max else None  # exact: maxima of logical values
    return FramePassResult(
        per_frame=out[:, :m],
        pattern_sum=acc_sum if want_sum else None,
        pattern_max=peak,
        variant=variant,
    )
