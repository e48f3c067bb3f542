"""MLX kernels of the ``mps`` runtime.

Two paths compute the fused frame pass (see
:meth:`~quantem_flow.runtimes.base.Runtime.frame_pass`):

``"mlx"`` (plain MLX operations; runs wherever MLX runs)
    ``per_frame = frames @ weights.T`` in float64, the pattern sum in a
    widened accumulator and the pattern maximum in the data's dtype.
    Float64 is not supported on the Metal GPU, so every operation that reads
    or writes float64 runs on the MLX *CPU* stream (``mx.cpu``), on Apple
    silicon's unified memory without a copy.  Nothing is ever lowered to
    float32: the accumulation dtype is float64 on every device, and
    :func:`precision_record` says so for provenance.

``"metal"`` (a small ``mx.fast.metal_kernel``; Apple GPUs only)
    One GPU thread per detector pixel walks the frames and accumulates the
    pattern sum (64-bit integer) and maximum for integer data of at most 32
    bits; ``per_frame`` and every float64 quantity still take the float64
    CPU-stream route above.  This path has **never been run in this
    project**: its development machine has no Metal device.  It is opt-in
    only (``MpsRuntime(path="metal")``) and the conformance suite has cases
    for it that run on a Mac.

Frames are processed in blocks of at most :data:`BLOCK_BYTES` of float64 so
the temporary float64 copy of a chunk stays bounded, and of at most
:data:`MAX_NARROW_SUM_FRAMES` frames so that MLX's native 32-bit sum of 8-
and 16-bit integers cannot overflow before it is widened to int64.

Non-finite pixels: the matrix product gives ``0 * NaN = NaN`` for a bad
pixel outside a weight row's support.  On real data the (small) per-frame
output is checked, and only frames with a non-finite value are fetched and
recomputed over the nonzero weights
(:func:`~quantem_flow.runtimes.nonfinite.repair_per_frame`); integer data
skip the check.  The patterns are per pixel (NaN like ``numpy.max``).
"""

from __future__ import annotations

from typing import Any, Literal

import mlx.core as mx
import numpy as np

from ...errors import DtypeError, ShapeError, UnsupportedOperationError
from ..nonfinite import repair_per_frame

__all__ = [
    "BLOCK_BYTES",
    "MAX_NARROW_SUM_FRAMES",
    "frame_pass_mlx",
    "metal_available",
    "mlx_dtype",
    "numpy_dtype",
    "precision_record",
    "sum_dtype",
    "to_device",
    "to_host",
]

#: Upper bound of the float64 temporary of one block of frames (bytes).
BLOCK_BYTES = 64 * 2**20
#: MLX sums 8/16-bit integers in (u)int32: 2**15 frames of |v| <= 2**16 stay
#: below 2**31, so the native sum of such a block is exact.
MAX_NARROW_SUM_FRAMES = 2**15

_NP_TO_MX: dict[np.dtype[Any], Any] = {
    np.dtype(np.bool_): mx.bool_,
    np.dtype(np.uint8): mx.uint8,
    np.dtype(np.uint16): mx.uint16,
    np.dtype(np.uint32): mx.uint32,
    np.dtype(np.uint64): mx.uint64,
    np.dtype(np.int8): mx.int8,
    np.dtype(np.int16): mx.int16,
    np.dtype(np.int32): mx.int32,
    np.dtype(np.int64): mx.int64,
    np.dtype(np.float16): mx.float16,
    np.dtype(np.float32): mx.float32,
    np.dtype(np.float64): mx.float64,
    np.dtype(np.complex64): mx.complex64,
}
_MX_TO_NP: dict[Any, np.dtype[Any]] = {v: k for k, v in _NP_TO_MX.items()}
_FRAME_KINDS = "uif"


def mlx_dtype(dtype: np.dtype[Any] | type | str) -> Any:
    """Return the MLX dtype equal to the NumPy ``dtype`` (byte order ignored).

    Raises
    ------
    DtypeError
        MLX has no such dtype (for example complex128 or strings).
    """
    dt = np.dtype(dtype).newbyteorder("=")
    try:
        return _NP_TO_MX[dt]
    except KeyError:
        raise DtypeError(
            f"MLX has no dtype equal to {dt}; supported: {sorted(str(d) for d in _NP_TO_MX)}. "
            "Convert the array explicitly (and record the conversion) before moving it to MLX"
        ) from None


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    """Return the NumPy dtype equal to the MLX ``dtype``.

    Raises
    ------
    DtypeError
        NumPy has no equal dtype (bfloat16).
    """
    try:
        return _MX_TO_NP[dtype]
    except KeyError:
        raise DtypeError(
            f"NumPy has no dtype equal to MLX {dtype}; cast it explicitly in MLX first"
        ) from None


def to_device(array: np.ndarray | Any) -> Any:
    """Copy a host array into MLX memory, keeping its dtype exactly.

    ``mx.array`` alone turns float64 into float32; this never does.  Arrays
    of a non-native byte order are converted to native order (same values).
    An MLX array is returned unchanged.

    Parameters
    ----------
    array
        A NumPy array (any shape, a dtype MLX has) or an MLX array.

    Returns
    -------
    mlx.core.array
        The device array (an independent copy of a host array).
    """
    if isinstance(array, mx.array):
        return array
    host = np.asarray(array)
    dt = host.dtype
    target = mlx_dtype(dt)
    if not dt.isnative:
        host = host.astype(dt.newbyteorder("="))
    out = mx.array(np.ascontiguousarray(host), dtype=target)
    mx.eval(out)
    return out


def to_host(array: Any) -> np.ndarray:
    """Copy an MLX array into a new NumPy array of the equal dtype.

    A NumPy array is returned unchanged.  The copy is independent of MLX's
    buffer, which MLX may recycle once the device array is released.
    """
    if isinstance(array, np.ndarray):
        return array
    dt = numpy_dtype(array.dtype)
    mx.eval(array)
    out = np.array(array, copy=True)
    if out.dtype != dt:  # pragma: no cover - np.array keeps the dtype in MLX 0.32
        raise DtypeError(f"MLX returned {out.dtype} for an array of {array.dtype}; expected {dt}")
    return out


def sum_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """Accumulator of a sum over frames: int64 for integers (uint64 for uint64), else float64.

    The same rule as the CPU reference.
    """
    if dtype.kind in "ui":
        return (
            np.dtype(np.uint64) if dtype.kind == "u" and dtype.itemsize == 8 else np.dtype(np.int64)
        )
    return np.dtype(np.float64)


def metal_available() -> bool:
    """Whether MLX can run Metal kernels on this machine."""
    try:
        return bool(mx.metal.is_available())
    except (AttributeError, RuntimeError):  # pragma: no cover - depends on the MLX build
        return False


def precision_record(device: str) -> dict[str, str]:
    """What the kernels accumulate in, and on which device, for provenance.

    Parameters
    ----------
    device
        ``"cpu"`` or ``"gpu"``: MLX's default device here.
    """
    where = (
        "the MLX CPU stream (the Metal GPU has no float64)"
        if device == "gpu"
        else "the MLX CPU stream (MLX's default device here)"
    )
    return {
        "per_frame_accumulation": "float64",
        "per_frame_device": "cpu",
        "pattern_sum_accumulation": "int64 for integer data (uint64 for uint64), else float64",
        "pattern_max_dtype": "the data's dtype (NaN propagates like numpy.max)",
        "float64_work_on": where,
        "lowered_precision": "never: no float32 accumulation on any device",
    }


def _frames_on_device(frames: np.ndarray | Any) -> tuple[Any, np.dtype[Any]]:
    if isinstance(frames, mx.array):
        dt = numpy_dtype(frames.dtype)
        arr = frames
    else:
        host = np.asarray(frames)
        dt = host.dtype.newbyteorder("=")
        if dt.kind not in _FRAME_KINDS:
            raise DtypeError(
                f"frame_pass takes integer or real frames, got dtype {host.dtype}; "
                "convert them explicitly first"
            )
        if host.ndim != 2:
            raise ShapeError(f"frames must be (n_frames, k_r * k_c), got shape {host.shape}")
        arr = to_device(host)
    if dt.kind not in _FRAME_KINDS:
        raise DtypeError(
            f"frame_pass takes integer or real frames, got MLX dtype {frames.dtype}; "
            "convert them explicitly first"
        )
    if arr.ndim != 2:
        raise ShapeError(f"frames must be (n_frames, k_r * k_c), got shape {tuple(arr.shape)}")
    return arr, dt


def _empty_max(k: int, dt: np.dtype[Any]) -> np.ndarray:
    fill = -np.inf if dt.kind == "f" else np.iinfo(dt).min
    return np.full(k, fill, dtype=dt)


_METAL_SOURCE = """
    uint p = thread_position_in_grid.x;
    uint k = uint(frames_shape[1]);
    uint n = uint(frames_shape[0]);
    if (p >= k) {
        return;
    }
    int64_t s = 0;
    T m = metal::numeric_limits<T>::lowest();
    for (uint i = 0; i < n; ++i) {
        T v = frames[size_t(i) * size_t(k) + size_t(p)];
        s += static_cast<int64_t>(v);
        m = metal::max(m, v);
    }
    psum[p] = s;
    pmax[p] = m;
"""

_metal_kernel: Any = None


def _metal_sum_max(arr: Any) -> tuple[Any, Any]:  # pragma: no cover - needs an Apple GPU
    """Pattern sum (int64) and max of integer frames (<= 32 bits) with one Metal kernel.

    NEVER RUN in this project (no Metal device); guarded by
    :func:`metal_available` and opt-in only.
    """
    global _metal_kernel
    if not metal_available():
        raise UnsupportedOperationError(
            "the Metal kernel path needs MLX on an Apple GPU; this machine's MLX has no Metal "
            "device. Use MpsRuntime(path='mlx') (the default)"
        )
    if _metal_kernel is None:
        _metal_kernel = mx.fast.metal_kernel(
            name="qf_pattern_sum_max",
            input_names=["frames"],
            output_names=["psum", "pmax"],
            source=_METAL_SOURCE,
            header="#include <metal_limits>\n",
        )
    k = int(arr.shape[1])
    psum, pmax = _metal_kernel(
        inputs=[arr],
        template=[("T", arr.dtype)],
        grid=(k, 1, 1),
        threadgroup=(min(256, k), 1, 1),
        output_shapes=[(k,), (k,)],
        output_dtypes=[mx.int64, arr.dtype],
        stream=mx.gpu,
    )
    return psum, pmax


def metal_handles(dtype: np.dtype[Any]) -> bool:
    """Whether the Metal kernel path computes sum/max for ``dtype`` (integers of <= 32 bits)."""
    return dtype.kind in "ui" and dtype.itemsize <= 4


def frame_pass_mlx(
    frames: np.ndarray | Any,
    weights: np.ndarray,
    *,
    want_sum: bool,
    want_max: bool,
    path: Literal["mlx", "metal"] = "mlx",
    block_bytes: int = BLOCK_BYTES,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Run the fused frame pass with MLX; see :class:`~quantem_flow.runtimes.base.Runtime`.

    Parameters
    ----------
    frames
        ``(n_frames, K)`` host array or MLX array, integer or real.
    weights
        ``(n_weights, K)`` weight rows (converted to float64).
    want_sum, want_max
        Also return the pattern sum / maximum.
    path
        ``"mlx"`` or ``"metal"`` (see the module docstring).
    block_bytes
        Upper bound of the float64 temporary of one block of frames.

    Returns
    -------
    tuple
        ``(per_frame, pattern_sum, pattern_max)`` as NumPy host arrays; the
        patterns are ``None`` unless requested.

    Raises
    ------
    ShapeError
        Frames or weights are not 2-D, or their pixel counts differ.
    DtypeError
        Frames are neither integer nor real.
    UnsupportedOperationError
        ``path="metal"`` on a machine without Metal.
    """
    arr, dt = _frames_on_device(frames)
    w_host = np.ascontiguousarray(weights, dtype=np.float64)
    n, k = (int(s) for s in arr.shape)
    if w_host.ndim != 2 or w_host.shape[1] != k:
        raise ShapeError(
            f"weights must be (n_weights, {k}) to match frames of {k} pixels, got shape "
            f"{w_host.shape}"
        )
    m = w_host.shape[0]
    use_metal = path == "metal" and metal_handles(dt) and (want_sum or want_max)
    if path == "metal" and not metal_available():
        raise UnsupportedOperationError(
            "the Metal kernel path needs MLX on an Apple GPU; this machine's MLX has no Metal "
            "device. Use MpsRuntime(path='mlx') (the default)"
        )
    f64 = mx.cpu  # float64 work always runs on the CPU stream (Metal has no float64)
    acc = sum_dtype(dt)
    if n == 0:
        return (
            np.zeros((0, m), dtype=np.float64),
            np.zeros(k, dtype=acc) if want_sum else None,
            _empty_max(k, dt) if want_max else None,
        )

    wt = mx.array(w_host, dtype=mx.float64).T
    step = max(1, min(n, MAX_NARROW_SUM_FRAMES, block_bytes // max(1, 8 * k)))
    narrow_int = dt.kind in "ui" and dt.itemsize <= 2
    acc_mx = mlx_dtype(acc)
    per_blocks: list[np.ndarray] = []
    total: Any = None
    for i0 in range(0, n, step):
        block = arr[i0 : i0 + step]
        as_f64 = block.astype(mx.float64, stream=f64)  # lazy: evaluated only if used
        outs: list[Any] = []
        prod: Any = None
        if m:
            prod = mx.matmul(as_f64, wt, stream=f64)
            outs.append(prod)
        if want_sum and not use_metal:
            if dt.kind == "f":
                part = mx.sum(as_f64, axis=0, stream=f64)
            elif narrow_int:
                part = mx.sum(block, axis=0).astype(acc_mx)  # (u)int32, exact for <= 2**15 frames
            else:
                part = mx.sum(block.astype(acc_mx), axis=0)
            total = part if total is None else mx.add(total, part, stream=f64)
            outs.append(total)
        if outs:
            mx.eval(*outs)  # bound the temporaries to one block
        if prod is not None:
            per_blocks.append(to_host(prod))
    per_frame = np.concatenate(per_blocks) if m else np.zeros((n, 0), dtype=np.float64)
    if dt.kind == "f" and m:  # 0 * NaN: recompute non-finite outputs over nonzero weights
        per_frame = repair_per_frame(
            per_frame, w_host, lambda rows: to_host(mx.take(arr, mx.array(rows), axis=0))
        )

    pattern_sum: np.ndarray | None = None
    pattern_max: np.ndarray | None = None
    if use_metal:  # pragma: no cover - needs an Apple GPU
        psum, pmax = _metal_sum_max(arr)
        pattern_sum = to_host(psum) if want_sum else None
        pattern_max = to_host(pmax) if want_max else None
    else:
        if want_sum:
            pattern_sum = to_host(total)
        if want_max:
            # NaN propagates through mx.max like numpy.max; float64 data on the CPU stream
            stream = f64 if dt == np.float64 else None
            pattern_max = to_host(mx.max(arr, axis=0, stream=stream))
    if pattern_sum is not None and pattern_sum.dtype != acc:
        pattern_sum = pattern_sum.astype(acc)
    return per_frame, pattern_sum, pattern_max
