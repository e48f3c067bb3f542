"""The fused frame pass on ``packed`` payloads (CPU, Numba).

The payload is never decoded whole.  One compiled loop decodes a group of
frames (4 to 64, about 256 KiB of decoded values, so the group stays in
the L2 cache) into a small reusable buffer of the payload's dtype, then runs
the dense fused kernel (:func:`~quantem_flow.runtimes.cpu.kernels._fused`)
on that buffer while it is in cache.  The results are therefore those of
the dense kernel on the dense equivalent (the structured kernel of
:mod:`~quantem_flow.runtimes.cpu.structure` for mask and moment rows when
the dense pass would take it): per-frame dot products in
float64, integer pattern sums in int64 (uint64 for uint64 data), the
pattern maximum in the payload's dtype.

Speed, measured on this project's shared 2-core machine on 256 frames of
256 x 256 uint16 with 5 weight rows and both patterns, in dense bytes per
second against the dense kernel in the same run: 0.55-1.1 GB/s packed
against 1.0-1.9 GB/s dense, 0.5-0.9 times the dense speed, on data held
2x (high dose) to 9x (1% counted) smaller.  Decoding is the difference;
the dot products are the dense kernel's.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ... import config
from ...errors import ParameterError, ShapeError
from ...representations.packed import PackedPayload, unpack_frames
from ..base import FramePassResult
from .kernels import _fused, sum_dtype
from .structure import (
    _seg0f,
    _seg0t,
    _seg1f,
    _seg1t,
    _seg2f,
    _seg2t,
    analyse_weights,
    finish_moment_rows,
    integer_mode,
    plan_arrays,
)

__all__ = ["GROUP_BYTES", "frame_pass_packed", "group_frames"]

#: Decoded bytes per group of frames (the group is 4 to 64 frames).
GROUP_BYTES = 256 * 1024


@numba.njit(cache=bool(config.get("numba_cache")), nogil=True)
def _packed_pass(  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    data, widths, offsets, bv, n, buf, weights, out, acc_sum, acc_max, do_sum, do_max
):
    g = buf.shape[0]
    for f0 in range(0, n, g):
        f1 = min(f0 + g, n)
        unpack_frames(data, widths, offsets, bv, f0, f1, buf)
        _fused(buf[: f1 - f0], weights, out[f0:f1], acc_sum, acc_max, do_sum, do_max)


def _make_packed_structured(integer: int, moments: bool) -> Any:
    """The packed structured pass for one cell kernel (``integer`` mode 0-2, ``moments``).

    The mode is a closure constant, so Numba prunes the other branches and
    compiles one dense group loop
    (:func:`~quantem_flow.runtimes.cpu.structure._make_structured_segments`),
    called by its module-level name so the pass stays cached on disk (a
    dispatcher held in the closure or passed as an argument is compiled
    again in every process).
    """

    @numba.njit(cache=bool(config.get("numba_cache")), nogil=True)
    def packed_structured(  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
        data, widths, offsets, bv, n, buf, p, gweights, out, acc, gout, acc_sum, acc_max, do_sum,
        do_max,
    ):  # fmt: skip
        # p: the plan's kernel arrays (structure.plan_arrays); same groups as _packed_pass
        e = np.zeros(0, dtype=np.int64)
        seg = (e, e, e, e, e, e, e, e, e, e)  # no segments in modes 0-2
        g = buf.shape[0]
        for f0 in range(0, n, g):
            f1 = min(f0 + g, n)
            unpack_frames(data, widths, offsets, bv, f0, f1, buf)
            block = buf[: f1 - f0]
            part = out[f0:f1]
            if integer == 0 and moments:
                _seg0t(
                    block, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9], p[10], p[11],
                    gweights, part, acc, gout, acc_sum, acc_max, do_sum, do_max, seg,
                )  # fmt: skip
            elif integer == 0:
                _seg0f(
                    block, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9], p[10], p[11],
                    gweights, part, acc, gout, acc_sum, acc_max, do_sum, do_max, seg,
                )  # fmt: skip
            elif integer == 1 and moments:
                _seg1t(
                    block, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9], p[10], p[11],
                    gweights, part, acc, gout, acc_sum, acc_max, do_sum, do_max, seg,
                )  # fmt: skip
            elif integer == 1:
                _seg1f(
                    block, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9], p[10], p[11],
                    gweights, part, acc, gout, acc_sum, acc_max, do_sum, do_max, seg,
                )  # fmt: skip
            elif moments:
                _seg2t(
                    block, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9], p[10], p[11],
                    gweights, part, acc, gout, acc_sum, acc_max, do_sum, do_max, seg,
                )  # fmt: skip
            else:
                _seg2f(
                    block, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9], p[10], p[11],
                    gweights, part, acc, gout, acc_sum, acc_max, do_sum, do_max, seg,
                )  # fmt: skip

    return packed_structured


#: The packed structured pass per ``(integer mode, moments)``, modes 0-2.
_PACKED_STRUCTURED = {
    (mode, moments): _make_packed_structured(mode, moments)
    for mode in range(3)
    for moments in (False, True)
}


def group_frames(frame_size: int, itemsize: int) -> int:
    """Frames decoded per group: about :data:`GROUP_BYTES`, a multiple of 4 in 4..64."""
    g = GROUP_BYTES // max(frame_size * itemsize, 1)
    return int(min(64, max(4, g - g % 4)))


def frame_pass_packed(
    payload: PackedPayload, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Run the fused frame pass on a packed chunk, decoding a few frames at a time.

    Parameters
    ----------
    payload
        A :class:`~quantem_flow.representations.packed.PackedPayload`.
    weights
        ``(n_weights, k_r * k_c)`` weight rows (cast to float64; may be 0 rows).
    want_sum, want_max
        Also accumulate the sum / maximum pattern over the frames.

    Returns
    -------
    FramePassResult
        Identical to the dense kernel on the dense equivalent.

    Raises
    ------
    ParameterError
        If ``payload`` is not a packed payload.
    ShapeError
        If the weight rows do not have one value per detector pixel.
    """
    if not isinstance(payload, PackedPayload):
        raise ParameterError(
            f"frame_pass_packed expects a PackedPayload, got {type(payload).__name__}; "
            "convert with Dataset4D.to_representation('packed')"
        )
    n, k = payload.n_frames, payload.frame_size
    vdt = payload.value_dtype
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[1] != k:
        raise ShapeError(
            f"weights must be (n_weights, {k}) for {payload.frame_shape} frames, got "
            f"{weights.shape}"
        )
    m = weights.shape[0]
    if m % 2:  # the fused kernel takes weight rows in pairs
        weights = np.concatenate([weights, np.zeros((1, k), dtype=np.float64)])
    out = np.empty((n, weights.shape[0]), dtype=np.float64)
    acc_sum = np.zeros(k if want_sum else 1, dtype=sum_dtype(vdt))
    acc_max = np.full(k, np.iinfo(vdt).min, dtype=vdt) if want_max else np.zeros(1, dtype=vdt)
    plan = analyse_weights(weights[:m], frame_shape=payload.frame_shape) if m else None
    variant: dict[str, Any] = (
        plan.describe(vdt) if plan else {"variant": "fused", "why": "no weight rows"}
    )
    if n and plan is not None and variant["variant"] == "structured":
        if plan.n_out > out.shape[1]:  # moment rows' sums go after the rows
            out = np.empty((n, plan.n_out), dtype=np.float64)
        buf = np.empty((min(group_frames(k, vdt.itemsize), n), k), dtype=vdt)
        g = buf.shape[0]
        _PACKED_STRUCTURED[(min(integer_mode(vdt), 2), bool(plan.need_moments))](
            payload.data,
            payload.widths,
            payload.offsets,
            payload.block_values,
            n,
            buf,
            plan_arrays(plan),
            plan.general_weights,
            out,
            np.empty((g, 3, max(plan.n_cells, 1)), dtype=np.int64),
            np.empty((g, max(plan.general_weights.shape[0], 1)), dtype=np.float64),
            acc_sum,
            acc_max,
            want_sum,
            want_max,
        )
        finish_moment_rows(out, plan)
    elif n:
        buf = np.empty((min(group_frames(k, vdt.itemsize), n), k), dtype=vdt)
        _packed_pass(
            payload.data,
            payload.widths,
            payload.offsets,
            payload.block_values,
            n,
            buf,
            weights,
            out,
            acc_sum,
            acc_max,
            want_sum,
            want_max,
        )
    return FramePassResult(
        per_frame=out[:, :m],
        pattern_sum=acc_sum if want_sum else None,
        pattern_max=acc_max if want_max else None,
        variant=variant,
    )
