"""Paired, packed and encoded payloads resident in MLX, and the kernels that run on them.

:meth:`MpsRuntime.put <quantem_flow.runtimes.mps.MpsRuntime.put>` turns a
host payload into an :class:`MlxPayload`: its large arrays become MLX arrays
(unified memory on Apple silicon, MLX's CPU heap elsewhere) and stay there
between passes; its small fields (shapes, dtypes, codec, runs, detector
ops) stay on the host.  What moves (:data:`MLX_FIELDS`):

- ``paired``: ``indptr``, ``indices``, ``counts``;
- ``packed``: ``widths``, ``offsets``, ``data``;
- ``encoded``: ``data`` (the compressed pieces, never decoded whole).

Kernels (every float64 quantity on the MLX CPU stream: the Metal GPU has no
float64; nothing is ever lowered to float32):

``paired`` (O(events), plain MLX, every operation on the MLX CPU stream)
    The frame of every event comes from ``indptr`` by a scatter and a
    cumulative sum; each weight row is gathered at the events' pixels,
    multiplied by the counts in float64 and scatter-added into
    ``per_frame`` (events in blocks of at most :data:`EVENT_BLOCK_BYTES` of
    float64 temporaries).  The sum pattern is an int64 (uint64 for uint64
    data) scatter-add of the counts, exact; the max pattern a scatter-max
    from 0 (an absent pixel is a 0) in the value dtype.  A non-finite weight
    at a pixel a frame does not hit gives NaN there, as ``0 * inf`` does in
    the dense kernel (the CPU paired kernel's rule).
``packed`` (bit unpacking with MLX integer ops, a group of frames at a time)
    Every block's width and word offset are gathered and broadcast over its
    values; each value is cut from its two 32-bit words (``lo >> s | hi <<
    (32 - s)``) and masked
    (``packed-blockwidth-v1``), into a dense group of frames of about
    :data:`GROUP_BYTES` in the value dtype; the dense MLX pass
    (:func:`~quantem_flow.runtimes.mps.kernels.frame_pass_mlx`) runs on the
    group and the groups' results are joined exactly (integer sums add in
    int64, maxima take the maximum).  On Apple silicon, ``path="metal"``
    unpacks with one ``mx.fast.metal_kernel`` thread per value instead
    (integers only, exact); it is used only where MLX answers on Metal,
    and recorded.
``encoded`` (decoded on the host: MLX has no LZ4, Zstandard or Blosc codec)
    The compressed bytes are read where they lie (a NumPy view of the
    resident MLX array, no copy), each piece decoded by the codec library
    on the host (:func:`~quantem_flow.representations.encoded.decode_piece`),
    the detector ops applied, and the frames written into one reusable MLX
    buffer of about :data:`GROUP_BYTES` through a view of its memory; the
    dense MLX pass runs on the buffer.  :meth:`MpsRuntime.describe` records
    that the decode ran on the host.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import mlx.core as mx
import numpy as np

from ...errors import ParameterError, ShapeError, UnsupportedOperationError
from ..base import FramePassResult
from ..resident import ResidentPayload, split_host_payload
from .kernels import frame_pass_mlx, metal_available, mlx_dtype, sum_dtype, to_device, to_host

__all__ = [
    "EVENT_BLOCK_BYTES",
    "GROUP_BYTES",
    "MLX_FIELDS",
    "MlxPayload",
    "frame_pass_encoded_mlx",
    "frame_pass_packed_mlx",
    "frame_pass_paired_mlx",
    "gather_encoded_mlx",
    "gather_packed_mlx",
    "gather_paired_mlx",
    "payload_paths",
]

#: Payload fields held as MLX arrays, per representation.
MLX_FIELDS: dict[str, tuple[str, ...]] = {
    "paired": ("indptr", "indices", "counts"),
    "packed": ("widths", "offsets", "data"),
    "encoded": ("data",),
}
#: Decoded bytes of one group of frames (packed: unpacked on MLX; encoded: the MLX buffer).
GROUP_BYTES = 8 * 2**20
#: Bytes of the float64 ``(events, weight rows)`` temporary of one block of events (paired).
EVENT_BLOCK_BYTES = 32 * 2**20

_CPU = mx.cpu  # float64 and 64-bit integer scatters: the MLX CPU stream on every machine


def payload_paths(path: Literal["mlx", "metal"]) -> dict[str, str]:
    """How each representation's pass runs, for provenance (:meth:`MpsRuntime.describe`)."""
    metal = path == "metal"
    return {
        "dense": "resident MLX array; fused pass in MLX (float64 on the MLX CPU stream)",
        "paired": (
            "indptr/indices/counts resident as MLX arrays; O(events) gather, float64 "
            "scatter-add of count * weight and int64 scatter-add/max of the counts with plain "
            "MLX ops on the MLX CPU stream"
        ),
        "packed": (
            "widths/offsets/words resident as MLX arrays; unpacked a group of frames at a time "
            + (
                "by an mx.fast.metal_kernel on the Metal GPU (exact integer unpacking)"
                if metal
                else "with plain MLX integer ops (no Metal kernel)"
            )
            + ", then the dense MLX pass on the group"
        ),
        "encoded": (
            "compressed bytes resident as an MLX uint8 array; decoded on the HOST by the codec "
            "library (MLX has no LZ4/Zstandard/Blosc codec), piece by piece, into a reusable "
            "MLX buffer of whole frames, then the dense MLX pass on the buffer"
        ),
    }


@dataclasses.dataclass(eq=False)
class MlxPayload(ResidentPayload):
    """A paired, packed or encoded payload whose large arrays are MLX arrays.

    Attributes
    ----------
    representation
        ``"paired"``, ``"packed"`` or ``"encoded"``.
    host_type
        The host payload class (to rebuild it, :meth:`to_host`).
    arrays
        ``{field: MLX array}`` (:data:`MLX_FIELDS`); empty once freed.
    fields
        The payload's other fields, on the host.
    dtype
        Logical dtype of the decoded values (the host payload's ``dtype``).
    nbytes
        Bytes of the payload as resident: the MLX arrays plus the host
        fields that are arrays (equal to the host payload's ``nbytes``).
    """

    RESIDENT_FIELDS: ClassVar[dict[str, tuple[str, ...]]] = MLX_FIELDS

    def where(self) -> str:
        """``"resident in MLX"``."""
        return "resident in MLX"

    @property
    def mlx_nbytes(self) -> int:
        """Bytes held in MLX arrays."""
        return self.resident_nbytes

    @classmethod
    def upload(cls, representation: str, payload: Any) -> MlxPayload:
        """Copy ``payload``'s large arrays into MLX (dtypes exact) and keep the rest on the host.

        Raises
        ------
        UnsupportedOperationError
            The representation has no MLX layout.
        ParameterError
            A paired payload has a threshold still pending.
        """
        names = MLX_FIELDS.get(representation)
        host, fields = split_host_payload(
            representation,
            payload,
            names,
            keeps="the mps runtime keeps dense, paired, packed and encoded payloads in MLX",
        )
        assert names is not None
        arrays = {}
        for name in names:
            a = np.ascontiguousarray(getattr(host, name))
            if not a.dtype.isnative:  # packed words are '<u4': the same values, native order
                a = a.astype(a.dtype.newbyteorder("="))
            arrays[name] = to_device(a)
        return cls(
            representation=representation,
            host_type=type(host),
            arrays=arrays,
            fields=fields,
            dtype=np.dtype(host.dtype),
            nbytes=int(host.nbytes),
        )

    def to_host(self) -> Any:
        """Rebuild the host payload (copies of the MLX arrays)."""
        self.check_live()
        arrays = {n: to_host(a) for n, a in self.arrays.items()}
        if self.representation == "packed":
            arrays["data"] = arrays["data"].astype("<u4", copy=False)
        return self.rebuild(arrays)

    def host_view(self) -> Any:
        """The host payload over NumPy *views* of the MLX arrays' memory (no copy)."""
        self.check_live()
        arrays = {}
        for n, a in self.arrays.items():
            mx.eval(a)
            arrays[n] = np.array(a, copy=False)
        return self.rebuild(arrays)


# ----------------------------------------------------------------------------- helpers


def _check_weights(weights: np.ndarray, k: int, frame_shape: tuple[int, int]) -> np.ndarray:
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != k:
        raise ShapeError(
            f"weights must be (n_weights, {k}) for frames of {tuple(frame_shape)}, got {w.shape}"
        )
    return w


def _empty_max(k: int, dt: np.dtype[Any]) -> np.ndarray:
    fill = -np.inf if dt.kind == "f" else np.iinfo(dt).min
    return np.full(k, fill, dtype=dt)


class _Joiner:
    """Joins the dense passes of consecutive groups of frames exactly."""

    def __init__(self) -> None:
        self.per_frame: list[np.ndarray] = []
        self.total: np.ndarray | None = None
        self.peak: np.ndarray | None = None

    def add(self, out: tuple[np.ndarray, np.ndarray | None, np.ndarray | None]) -> None:
        per_frame, s, m = out
        self.per_frame.append(per_frame)
        if s is not None:
            self.total = s.copy() if self.total is None else self.total + s
        if m is not None:
            self.peak = m.copy() if self.peak is None else np.maximum(self.peak, m)

    def result(self, variant: dict[str, Any]) -> FramePassResult:
        return FramePassResult(np.concatenate(self.per_frame), self.total, self.peak, variant)


def _group_frames(k: int, itemsize: int, n: int) -> int:
    return max(1, min(max(n, 1), GROUP_BYTES // max(k * itemsize, 1)))


# ----------------------------------------------------------------------------- paired


def _on_cpu_stream(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``kernel`` with MLX's CPU stream as the default (float64, 64-bit scatters)."""

    @functools.wraps(kernel)
    def run(*args: Any, **kwargs: Any) -> Any:
        with mx.stream(_CPU):
            return kernel(*args, **kwargs)

    return run


def _frame_of_events(indptr: Any, n: int, n_events: int) -> Any:
    """Frame index (int32) of every event: a scatter of frame starts, then a cumulative sum."""
    marks = mx.zeros((n_events + 1,), dtype=mx.int32, stream=_CPU)
    if n > 1:
        starts = indptr[1:n]
        marks = marks.at[starts].add(mx.ones((n - 1,), dtype=mx.int32, stream=_CPU))
    return mx.cumsum(marks[:n_events], stream=_CPU)


@_on_cpu_stream
def frame_pass_paired_mlx(
    payload: MlxPayload, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Fused pass on a resident paired payload, O(events); see the module docstring."""
    payload.check_live()
    kr, kc = payload.frame_shape
    k = int(kr) * int(kc)
    n = payload.n_frames
    w = _check_weights(weights, k, (kr, kc))
    m = int(w.shape[0])
    vdt = np.dtype(payload.value_dtype).newbyteorder("=")
    acc = sum_dtype(vdt)
    indices = payload.arrays["indices"]
    counts = payload.arrays["counts"]
    n_events = int(indices.shape[0])
    per_frame = np.zeros((n, m), dtype=np.float64)
    frame_of: Any = None
    if n and n_events and m:
        frame_of = _frame_of_events(payload.arrays["indptr"], n, n_events)
        wt = mx.array(np.ascontiguousarray(w.T), dtype=mx.float64)  # (K, m)
        out = mx.zeros((n, m), dtype=mx.float64, stream=_CPU)
        step = max(1, EVENT_BLOCK_BYTES // (8 * m))
        for e0 in range(0, n_events, step):
            idx = indices[e0 : e0 + step]
            vals = mx.take(wt, idx, axis=0, stream=_CPU)  # (events, m)
            c = counts[e0 : e0 + step].astype(mx.float64, stream=_CPU)
            terms = mx.multiply(vals, c[:, None], stream=_CPU)
            out = out.at[frame_of[e0 : e0 + step]].add(terms)
            mx.eval(out)  # bound the temporaries to one block
        per_frame = to_host(out)
    if n and m and not np.isfinite(w).all():
        # a non-finite weight at a pixel a frame misses: 0 * inf = NaN in the dense kernel
        bad = ~np.isfinite(w)  # (m, K)
        need = bad.sum(axis=1)
        hits = np.zeros((n, m), dtype=np.int64)
        if n_events:
            if frame_of is None:
                frame_of = _frame_of_events(payload.arrays["indptr"], n, n_events)
            bad_t = mx.array(np.ascontiguousarray(bad.T).astype(np.int32))  # (K, m)
            got = mx.zeros((n, m), dtype=mx.int32, stream=_CPU)
            got = got.at[frame_of].add(mx.take(bad_t, indices, axis=0, stream=_CPU))
            hits = to_host(got).astype(np.int64)
        per_frame[hits < need[None, :]] = np.nan
    pattern_sum: np.ndarray | None = None
    pattern_max: np.ndarray | None = None
    if want_sum:
        total = mx.zeros((k,), dtype=mlx_dtype(acc), stream=_CPU)
        if n_events:
            total = total.at[indices].add(counts.astype(mlx_dtype(acc), stream=_CPU))
        pattern_sum = to_host(total)
    if want_max:
        if n == 0:
            pattern_max = _empty_max(k, vdt)
        else:
            peak = mx.zeros((k,), dtype=mlx_dtype(vdt), stream=_CPU)
            if n_events:
                peak = peak.at[indices].maximum(counts.astype(mlx_dtype(vdt), stream=_CPU))
            pattern_max = to_host(peak)
    variant = {
        "variant": "mps paired scatter",
        "why": "O(events): weights gathered at the events, float64 scatter-add per frame",
        "events": n_events,
        "device": "MLX CPU stream",
    }
    return FramePassResult(per_frame, pattern_sum, pattern_max, variant)


@_on_cpu_stream
def gather_paired_mlx(payload: MlxPayload, indices: np.ndarray) -> np.ndarray:
    """Pixels ``indices`` of every frame of a resident paired payload (a scatter of events)."""
    payload.check_live()
    kr, kc = payload.frame_shape
    k = int(kr) * int(kc)
    idx = _check_indices(indices, k)
    n = payload.n_frames
    vdt = np.dtype(payload.value_dtype).newbyteorder("=")
    ev = payload.arrays["indices"]
    n_events = int(ev.shape[0])
    width = idx.size + 1  # a last column collects the events of pixels not asked for
    if n == 0 or idx.size == 0 or n_events == 0:
        return np.zeros((n, idx.size), dtype=vdt)
    column = np.full(k, idx.size, dtype=np.int64)
    column[idx] = np.arange(idx.size)
    col = mx.take(mx.array(column), ev, stream=_CPU)
    frame_of = _frame_of_events(payload.arrays["indptr"], n, n_events).astype(mx.int64)
    flat = mx.add(mx.multiply(frame_of, width, stream=_CPU), col, stream=_CPU)
    out = mx.zeros((n * width,), dtype=mlx_dtype(vdt), stream=_CPU)
    # pixels are unique within a frame: each wanted cell gets at most one event (a maximum
    # from 0 is that event's count, and cannot overflow in the extra column as a sum could)
    out = out.at[flat].maximum(payload.arrays["counts"].astype(mlx_dtype(vdt), stream=_CPU))
    host = to_host(out).reshape(n, width)
    return np.ascontiguousarray(host[:, : idx.size])


def _check_indices(indices: np.ndarray, k: int) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= k):
        raise ParameterError(
            f"gather indices must lie in [0, {k}) (flat detector pixels), got "
            f"{int(idx.min())} .. {int(idx.max())}"
        )
    return idx


# ----------------------------------------------------------------------------- packed

_METAL_UNPACK = """
    uint e = thread_position_in_grid.x;
    uint k = uint(geom[0]);
    uint nb = uint(geom[1]);
    uint bv = uint(geom[2]);
    uint f0 = uint(geom[3]);
    uint g = uint(geom[4]);
    if (e >= g * k) {
        return;
    }
    uint f = e / k;
    uint p = e - f * k;
    size_t blk = size_t(f0 + f) * size_t(nb) + size_t(p / bv);
    uint w = uint(widths[blk]);
    if (w == 0u) {
        out[e] = T(0);  // a width-0 block stores no words (it may start at the pad word)
        return;
    }
    uint q = (p % bv) * w;
    size_t word = size_t(offsets[blk]) + size_t(q >> 5);
    ulong x = ulong(data[word]) | (ulong(data[word + 1]) << 32);  // word + 1 <= the pad word
    out[e] = T((x >> (q & 31u)) & ((1ul << w) - 1ul));
"""

_metal_unpack_kernel: Any = None


def _unpack_metal(
    payload: MlxPayload, f0: int, f1: int, dt: Any
) -> Any:  # pragma: no cover - needs an Apple GPU
    """Unpack frames ``f0:f1`` with one Metal thread per value (NEVER RUN here: no Metal)."""
    global _metal_unpack_kernel
    if not metal_available():
        raise UnsupportedOperationError(
            "the Metal unpacking kernel needs MLX on an Apple GPU; this machine's MLX has no "
            "Metal device. Use MpsRuntime(path='mlx') (the default)"
        )
    if _metal_unpack_kernel is None:
        _metal_unpack_kernel = mx.fast.metal_kernel(
            name="qf_unpack_blockwidth",
            input_names=["data", "widths", "offsets", "geom"],
            output_names=["out"],
            source=_METAL_UNPACK,
        )
    kr, kc = payload.frame_shape
    k = int(kr) * int(kc)
    bv = int(payload.block_values)
    nb = -(-k // bv)
    g = f1 - f0
    geom = mx.array([k, nb, bv, f0, g], dtype=mx.int64)
    a = payload.arrays
    (out,) = _metal_unpack_kernel(
        inputs=[a["data"], a["widths"], a["offsets"], geom],
        template=[("T", dt)],
        grid=(g * k, 1, 1),
        threadgroup=(min(256, max(g * k, 1)), 1, 1),
        output_shapes=[(g, k)],
        output_dtypes=[dt],
        stream=mx.gpu,
    )
    return out


class _Unpacker:
    """Unpacks groups of frames of a resident packed payload with plain MLX integer ops.

    One width and one word offset are gathered per *block*, and broadcast
    over its ``block_values`` positions (the last block of a frame padded to
    a full block; the padding is cut off, never read as values).
    """

    def __init__(self, payload: MlxPayload, path: Literal["mlx", "metal"]) -> None:
        kr, kc = payload.frame_shape
        self.payload = payload
        self.k = int(kr) * int(kc)
        self.bv = int(payload.block_values)
        self.nb = -(-self.k // self.bv)
        self.dt = mlx_dtype(np.dtype(payload.value_dtype).newbyteorder("="))
        self.metal = path == "metal"
        self.blocks = mx.arange(self.nb, dtype=mx.int64)
        self.t = mx.arange(self.bv, dtype=mx.uint32)
        self.last_word = int(payload.arrays["data"].shape[0]) - 1

    def __call__(self, f0: int, f1: int) -> Any:
        if self.metal:  # pragma: no cover - needs an Apple GPU
            return _unpack_metal(self.payload, f0, f1, self.dt)
        a = self.payload.arrays
        g = f1 - f0
        blk = mx.arange(f0, f1, dtype=mx.int64)[:, None] * self.nb + self.blocks[None, :]
        w = mx.take(a["widths"], blk).astype(mx.uint32)[:, :, None]  # (g, nb, 1)
        q = self.t[None, None, :] * w  # bit position of each value in its block (< 2**11)
        word = mx.take(a["offsets"], blk)[:, :, None] + mx.right_shift(q, 5).astype(mx.int64)
        word = mx.minimum(word, self.last_word)  # width-0 and padded positions stay in range
        nxt = mx.minimum(word + 1, self.last_word)
        lo = mx.take(a["data"], word)
        hi = mx.take(a["data"], nxt)
        s = mx.bitwise_and(q, 31)
        # the value's bits: (lo >> s) | (hi << (32 - s)), the second part only when s > 0
        upper = mx.where(s > 0, mx.left_shift(hi, mx.subtract(32, s)), 0).astype(mx.uint32)
        x = mx.bitwise_or(mx.right_shift(lo, s), upper)
        one = mx.array(1, dtype=mx.uint32)
        v = mx.bitwise_and(x, mx.left_shift(one, w) - one)  # w <= 16: the mask fits
        return v.reshape(g, self.nb * self.bv)[:, : self.k].astype(self.dt)


def _packed_groups(payload: MlxPayload, path: Literal["mlx", "metal"]) -> tuple[Any, int, int]:
    unpack = _Unpacker(payload, path)
    vdt = np.dtype(payload.value_dtype)
    return unpack, unpack.k, _group_frames(unpack.k, max(vdt.itemsize, 8), payload.n_frames)


def frame_pass_packed_mlx(
    payload: MlxPayload,
    weights: np.ndarray,
    *,
    want_sum: bool,
    want_max: bool,
    path: Literal["mlx", "metal"] = "mlx",
) -> FramePassResult:
    """Fused pass on a resident packed payload, unpacked in MLX a group of frames at a time."""
    payload.check_live()
    unpack, k, group = _packed_groups(payload, path)
    _check_weights(weights, k, payload.frame_shape)
    n = payload.n_frames
    variant = {
        "variant": "mps packed unpack",
        "unpack": "mx.fast.metal_kernel on the Metal GPU"
        if unpack.metal
        else "plain MLX integer ops (no Metal kernel)",
        "group_frames": group,
    }
    if n == 0:
        empty = mx.zeros((0, k), dtype=unpack.dt)
        per_frame, s, m = frame_pass_mlx(empty, weights, want_sum=want_sum, want_max=want_max)
        return FramePassResult(per_frame, s, m, variant)
    join = _Joiner()
    for f0 in range(0, n, group):
        frames = unpack(f0, min(n, f0 + group))
        join.add(frame_pass_mlx(frames, weights, want_sum=want_sum, want_max=want_max))
    return join.result(variant)


def gather_packed_mlx(
    payload: MlxPayload, indices: np.ndarray, *, path: Literal["mlx", "metal"] = "mlx"
) -> np.ndarray:
    """Pixels ``indices`` of every frame, unpacked in MLX a group of frames at a time."""
    payload.check_live()
    unpack, k, group = _packed_groups(payload, path)
    idx = _check_indices(indices, k)
    n = payload.n_frames
    vdt = np.dtype(payload.value_dtype).newbyteorder("=")
    out = np.empty((n, idx.size), dtype=vdt)
    sel = mx.array(idx)
    for f0 in range(0, n, group):
        f1 = min(n, f0 + group)
        out[f0:f1] = to_host(mx.take(unpack(f0, f1), sel, axis=1))
    return out


# ----------------------------------------------------------------------------- encoded


def _encoded_groups(
    host: Any, consume: Callable[[Any, int], None]
) -> tuple[int, np.dtype[Any], int]:
    """Decode the compressed pieces of ``host`` on the host into a reusable MLX buffer.

    ``host`` is :meth:`MlxPayload.host_view` (the resident bytes, not a
    copy).  ``consume(buffer[:fill], fill)`` runs on each filled buffer;
    returns ``(pixels per frame, logical dtype, frames of the buffer)``.
    """
    from ...representations.encoded import PieceCache

    n = host.n_frames
    okr, okc = host.out_frame_shape
    k = okr * okc
    logical = np.dtype(host.dtype)
    kr, kc = host.frame_shape
    raw = host.value_dtype.newbyteorder("=")
    batch_n = _group_frames(max(k * logical.itemsize, kr * kc * raw.itemsize), 1, n)
    staging = np.empty((batch_n, kr, kc), dtype=raw)
    buffer = mx.zeros((batch_n, k), dtype=mlx_dtype(logical))
    mx.eval(buffer)
    view = np.array(buffer, copy=False)  # writes land in the MLX buffer's memory
    done = 0
    fill = 0

    def flush() -> None:
        nonlocal done, fill
        frames: np.ndarray = staging[:fill]
        for op in host.post_ops:
            frames = op.apply(frames)
        np.copyto(view[:fill], frames.reshape(fill, k), casting="safe")
        consume(buffer[:fill], fill)
        done += fill
        fill = 0

    cache = PieceCache(host)
    for piece, first, count in host.runs.tolist():
        decoded = cache.get(piece)
        taken = 0
        while taken < count:
            c = min(count - taken, batch_n - fill)
            staging[fill : fill + c] = decoded[first + taken : first + taken + c]
            fill += c
            taken += c
            if fill == batch_n:
                flush()
    if fill:
        flush()
    if done != n:  # pragma: no cover - the payload's runs cover its frames (checked at build)
        raise ShapeError(f"internal error: {done} of {n} encoded frames decoded")
    return k, logical, batch_n


def frame_pass_encoded_mlx(
    payload: MlxPayload, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Fused pass on a resident encoded payload, decoded on the host into an MLX buffer."""
    host = payload.host_view()  # the compressed bytes where they lie: no copy
    okr, okc = host.out_frame_shape
    w = _check_weights(weights, int(okr) * int(okc), (okr, okc))
    join = _Joiner()

    def consume(frames: Any, fill: int) -> None:
        join.add(frame_pass_mlx(frames, w, want_sum=want_sum, want_max=want_max))

    k, logical, buffer_frames = _encoded_groups(host, consume)
    variant = {
        "variant": "mps encoded host decode",
        "decode": "host",
        "why": f"MLX has no {host.codec} decoder: pieces are decoded by the codec library on "
        "the host into a reusable MLX buffer; the compressed bytes stay resident in MLX",
        "codec": host.codec,
        "buffer_frames": buffer_frames,
    }
    if not join.per_frame:
        empty = mx.zeros((0, k), dtype=mlx_dtype(logical))
        per_frame, s, m = frame_pass_mlx(empty, w, want_sum=want_sum, want_max=want_max)
        return FramePassResult(per_frame, s, m, variant)
    return join.result(variant)


def gather_encoded_mlx(payload: MlxPayload, indices: np.ndarray) -> np.ndarray:
    """Pixels ``indices`` of every frame, taken from the MLX buffer the host decodes into."""
    host = payload.host_view()
    okr, okc = host.out_frame_shape
    idx = _check_indices(indices, int(okr) * int(okc))
    sel = mx.array(idx)
    parts: list[np.ndarray] = []

    def consume(frames: Any, fill: int) -> None:
        parts.append(to_host(mx.take(frames, sel, axis=1)))

    _, logical, _ = _encoded_groups(host, consume)
    if not parts:
        return np.zeros((0, idx.size), dtype=logical)
    return np.ascontiguousarray(np.concatenate(parts))
