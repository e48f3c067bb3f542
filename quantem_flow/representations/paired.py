"""The paired representation: electron-counted frames as (pixel, count) pairs.

Layout ``paired-csr-v1`` (one chunk of ``n = rows * cols`` frames, scan order
row-major):

``indptr``
    ``int64 (n + 1,)``; the pairs of frame ``i`` are ``[indptr[i], indptr[i+1])``.
``indices``
    Flat detector pixel ``r * k_c + c`` of each pair; ``uint16`` when
    ``k_r * k_c <= 65536``, else ``uint32``.  Sorted and unique within a frame.
``counts``
    The value at that pixel, ``>= 1``; the smallest unsigned dtype
    (``uint8``/``uint16``/``uint32``/``uint64``) that holds the chunk's
    largest value.  Pixels absent from a frame are 0.

``value_dtype`` is the logical (dense) dtype of the values, which every
exact result keeps (for example the maximum pattern).  Only non-negative
integer data are admitted; the conversion is exact unless a ``threshold`` is
asked for, in which case values below it are dropped (not lossless) and the
exactness check and provenance say so.

Everything here costs O(pairs) (crops, binning, scatter) or one pass over a
dense block (conversion and its check); nothing densifies a chunk except
:meth:`Paired.to_dense`, which is only for explicit conversions.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, ClassVar

import numba
import numpy as np

from .. import config
from ..errors import ConversionError, ParameterError, ShapeError
from .base import Representation

__all__ = [
    "PAIRED_SCHEMA",
    "Paired",
    "PairedPayload",
    "bin_pairs",
    "check_threshold",
    "counts_dtype_for",
    "crop_pairs",
    "index_dtype_for",
    "pairs_from_events",
    "threshold_pairs",
]

#: Versioned name of the layout above.
PAIRED_SCHEMA = "paired-csr-v1"

_UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)


def _jit(fn: Any) -> Any:
    return numba.njit(cache=bool(config.get("numba_cache")), nogil=True)(fn)


def index_dtype_for(n_pixels: int) -> np.dtype[Any]:
    """Return the dtype of flat pixel indices for a frame of ``n_pixels`` pixels.

    ``uint16`` up to 65536 pixels (256 x 256), ``uint32`` up to 2**32.
    """
    if n_pixels <= 2**16:
        return np.dtype(np.uint16)
    if n_pixels <= 2**32:
        return np.dtype(np.uint32)
    raise ShapeError(
        f"a paired frame holds at most 2**32 pixels, got {n_pixels}; bin the detector first"
    )


def counts_dtype_for(max_count: int) -> np.dtype[Any]:
    """Return the smallest unsigned dtype holding ``max_count``."""
    for dt in _UNSIGNED:
        if max_count <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ParameterError(f"a count of {max_count} does not fit in 64 bits")


@dataclasses.dataclass
class PairedPayload:
    """One chunk of frames as CSR-like (pixel index, count) pairs.

    Attributes
    ----------
    scan_shape
        ``(rows, cols)`` of scan positions in the chunk.
    frame_shape
        ``(k_r, k_c)`` of one frame.
    indptr
        ``int64 (rows * cols + 1,)`` offsets of each frame's pairs.
    indices
        Flat pixel ``r * k_c + c`` of each pair (``uint16`` or ``uint32``,
        see :func:`index_dtype_for`), sorted and unique within a frame.
    counts
        Value of each pair, ``>= 1``, in the smallest unsigned dtype holding
        the largest one.
    value_dtype
        Logical dtype of the dense values (the dataset's dtype).
    threshold
        ``None`` for an exact conversion; otherwise the threshold below which
        values were dropped when the payload was made (recorded, not
        lossless).
    pending_threshold
        A threshold asked for but not applied yet: a native read sets it so
        that it applies to the values as the dataset presents them, after
        detector crops and binning; :meth:`Paired.apply_detector_ops` applies
        it last.  Kernels and :meth:`Paired.to_dense` refuse such a payload.
    """

    scan_shape: tuple[int, int]
    frame_shape: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    counts: np.ndarray
    value_dtype: np.dtype[Any]
    threshold: int | None = None
    pending_threshold: int | None = None

    def __post_init__(self) -> None:
        self.scan_shape = (int(self.scan_shape[0]), int(self.scan_shape[1]))
        self.frame_shape = (int(self.frame_shape[0]), int(self.frame_shape[1]))
        self.value_dtype = np.dtype(self.value_dtype)
        n = self.scan_shape[0] * self.scan_shape[1]
        K = self.frame_shape[0] * self.frame_shape[1]
        what = f"paired payload of {self.scan_shape} frames of {self.frame_shape}"
        if self.indptr.dtype != np.int64 or self.indptr.shape != (n + 1,):
            raise ShapeError(
                f"{what}: indptr must be int64 of shape {(n + 1,)}, got {self.indptr.dtype} "
                f"{self.indptr.shape}"
            )
        if self.indices.ndim != 1 or self.counts.shape != self.indices.shape:
            raise ShapeError(
                f"{what}: indices and counts must be 1-D of one length, got "
                f"{self.indices.shape} and {self.counts.shape}"
            )
        if self.indices.dtype != index_dtype_for(K):
            raise ShapeError(
                f"{what}: indices must be {index_dtype_for(K)} for {K} pixels, got "
                f"{self.indices.dtype}"
            )
        if self.counts.dtype.kind != "u":
            raise ShapeError(f"{what}: counts must be unsigned, got {self.counts.dtype}")
        if self.value_dtype.kind not in "ui":
            raise ShapeError(f"{what}: value_dtype must be integer, got {self.value_dtype}")
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != self.indices.shape[0]:
            raise ShapeError(
                f"{what}: indptr must run from 0 to {self.indices.shape[0]} pairs, got "
                f"{int(self.indptr[0])} .. {int(self.indptr[-1])}"
            )

    # -- Payload protocol ----------------------------------------------------------
    @property
    def dtype(self) -> np.dtype[Any]:
        """Logical dtype of the decoded values."""
        return self.value_dtype

    @property
    def nbytes(self) -> int:
        """Physical bytes of ``indptr``, ``indices`` and ``counts``."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.counts.nbytes)

    # -- description -------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        """Frames (scan positions) in the chunk."""
        return self.scan_shape[0] * self.scan_shape[1]

    @property
    def n_pixels(self) -> int:
        """Pixels per frame ``k_r * k_c``."""
        return self.frame_shape[0] * self.frame_shape[1]

    @property
    def n_events(self) -> int:
        """Stored (pixel, count) pairs: the non-zero pixels over all frames."""
        return int(self.indices.shape[0])

    @property
    def total_counts(self) -> int:
        """Sum of every count (electrons, for counted data)."""
        return int(self.counts.sum(dtype=np.uint64))

    @property
    def occupancy(self) -> float:
        """Fraction of pixels that are non-zero (``n_events / (n_frames * n_pixels)``)."""
        total = self.n_frames * self.n_pixels
        return float(self.n_events / total) if total else 0.0

    @property
    def dense_nbytes(self) -> int:
        """Bytes of the same data held dense in :attr:`value_dtype`."""
        return self.n_frames * self.n_pixels * self.value_dtype.itemsize

    def validate(self) -> None:
        """Check every invariant of the layout (O(pairs)).

        Raises
        ------
        ConversionError
            If an index is out of range, indices are not sorted and unique
            within a frame, or a count is 0.
        """
        bad = _invalid_pairs(self.indptr, self.indices, self.counts, self.n_pixels)
        if bad >= 0:
            raise ConversionError(
                f"paired payload breaks {PAIRED_SCHEMA} in frame {bad}: indices must lie in "
                f"[0, {self.n_pixels}), be sorted and unique within a frame, and counts be >= 1"
            )

    def require_applied(self) -> None:
        """Raise if a threshold is still pending (see :attr:`pending_threshold`)."""
        if self.pending_threshold is not None:
            raise ParameterError(
                f"this paired payload has a threshold ({self.pending_threshold}) that is not "
                "applied yet; pass it through Paired().apply_detector_ops(payload, ops) first "
                "(Dataset4D.load_payload does)"
            )

    def frame_pairs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(indices, counts)`` of frame ``i`` (views)."""
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.indices[a:b], self.counts[a:b]


# ----------------------------------------------------------------------------- kernels


@_jit
def _invalid_pairs(indptr, indices, counts, n_pixels):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    n = indptr.shape[0] - 1
    for i in range(n):
        prev = np.int64(-1)
        for q in range(indptr[i], indptr[i + 1]):
            p = np.int64(indices[q])
            if p <= prev or p >= n_pixels or counts[q] == 0:
                return i
            prev = p
    return -1


@_jit
def _count_nonzero(flat, t, zero):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Pairs per frame (values >= t, t >= 1), the largest kept value and the
    # number of negative values (t is in the data's dtype).
    n, k = flat.shape
    per = np.zeros(n, dtype=np.int64)
    vmax = zero
    negative = 0
    for i in range(n):
        row = flat[i]
        c = 0
        for p in range(k):
            v = row[p]
            if v >= t:
                c += 1
                if v > vmax:
                    vmax = v
            elif v < zero:
                negative += 1
        per[i] = c
    return per, vmax, negative


@_jit
def _fill_pairs(flat, t, indptr, indices, counts):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    n, k = flat.shape
    for i in range(n):
        row = flat[i]
        q = indptr[i]
        for p in range(k):
            v = row[p]
            if v >= t:
                indices[q] = p
                counts[q] = v
                q += 1


@_jit
def _scatter(indptr, indices, counts, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    n = indptr.shape[0] - 1
    for i in range(n):
        row = out[i]
        for q in range(indptr[i], indptr[i + 1]):
            row[indices[q]] = counts[q]


@_jit
def _compare(flat, indptr, indices, counts, t, zero):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Compare the payload with the dense block thresholded at t (t >= 1 in the
    # data's dtype).  Returns (values that differ, expected total, expected
    # non-zero values, stored total, stored pairs, dropped values, dropped total).
    n, k = flat.shape
    differ = 0
    exp_total = 0.0
    exp_nz = 0
    got_total = 0.0
    dropped = 0
    dropped_total = 0.0
    for i in range(n):
        row = flat[i]
        q = indptr[i]
        end = indptr[i + 1]
        for p in range(k):
            v = row[p]
            stored = np.uint64(0)
            hit = False
            if q < end and np.int64(indices[q]) == p:
                stored = np.uint64(counts[q])
                hit = True
                q += 1
            if v >= t:
                exp_total += np.float64(v)
                exp_nz += 1
                if not hit or stored != np.uint64(v):
                    differ += 1
            else:
                if v != zero:
                    dropped += 1
                    dropped_total += np.float64(v)
                if hit:
                    differ += 1
            if hit:
                got_total += np.float64(stored)
        differ += end - q  # pairs left over: unsorted, repeated or out of range
    return differ, exp_total, exp_nz, got_total, indptr[n], dropped, dropped_total


@_jit
def _crop_pairs(indptr, indices, counts, kc, r0, r1, c0, c1, out_idx, out_cnt):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    n = indptr.shape[0] - 1
    new_kc = c1 - c0
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    w = 0
    vmax = np.uint64(0)
    for i in range(n):
        for q in range(indptr[i], indptr[i + 1]):
            p = np.int64(indices[q])
            r = p // kc
            c = p - r * kc
            if r0 <= r < r1 and c0 <= c < c1:
                v = counts[q]
                out_idx[w] = (r - r0) * new_kc + (c - c0)
                out_cnt[w] = v
                if np.uint64(v) > vmax:
                    vmax = np.uint64(v)
                w += 1
        new_ptr[i + 1] = w
    return new_ptr, vmax


# Merging pairs per frame (binning, events -> pairs): the counts go into a
# scratch accumulator over the frame's pixels and the touched pixels into a
# bitmap (k_r * k_c / 8 bytes: 41 KB for 576 x 576, in cache); the bitmap is
# then walked word by word and each set bit found with a de Bruijn
# count-trailing-zeros, which gives the pixels sorted without sorting.  Very
# sparse frames on a huge detector (fewer pixels than 1 per 64 words) sort
# their few touched pixels instead of walking the whole bitmap.
_DEBRUIJN64 = 0x03F79D71B4CB0A89
_CTZ_TABLE = np.zeros(64, dtype=np.int64)
for _i in range(64):
    _CTZ_TABLE[((1 << _i) * _DEBRUIJN64 % 2**64) >> 58] = _i
del _i


@_jit
def _emit_frame(bits, acc, touched, nt, t, out_idx, out_cnt, w, vmax, table):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Write the touched pixels of one frame in increasing order (values >= t),
    # clearing the bitmap; return the new write position and maximum.
    nwords = bits.shape[0]
    if nt * 64 < nwords:
        sel = touched[:nt]
        sel.sort()
        for j in range(nt):
            b = sel[j]
            bits[b >> 6] = np.uint64(0)
            v = acc[b]
            if v >= t:
                out_idx[w] = b
                out_cnt[w] = v
                if v > vmax:
                    vmax = v
                w += 1
        return w, vmax
    one = np.uint64(1)
    db = np.uint64(_DEBRUIJN64)
    shift = np.uint64(58)
    for wi in range(nwords):
        word = bits[wi]
        if word != 0:
            bits[wi] = np.uint64(0)
            base = np.int64(wi) * 64
            while word != 0:
                low = word & (~word + one)
                b = base + table[np.int64((low * db) >> shift)]
                v = acc[b]
                if v >= t:
                    out_idx[w] = b
                    out_cnt[w] = v
                    if v > vmax:
                        vmax = v
                    w += 1
                word ^= low
    return w, vmax


@_jit
def _bin_pairs(indptr, indices, counts, kc, fr, fc, n_bc, n_new, out_idx, out_cnt, table):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Sum the pairs of each frame into bins; bins come out sorted and unique.
    n = indptr.shape[0] - 1
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    acc = np.empty(n_new, dtype=np.uint64)
    bits = np.zeros((n_new + 63) // 64, dtype=np.uint64)
    most = 0
    for i in range(n):
        most = max(most, indptr[i + 1] - indptr[i])
    touched = np.empty(min(most, n_new), dtype=np.int64)
    one = np.uint64(1)
    w = 0
    vmax = np.uint64(0)
    for i in range(n):
        nt = 0
        for q in range(indptr[i], indptr[i + 1]):
            p = np.int64(indices[q])
            r = p // kc
            c = p - r * kc
            b = (r // fr) * n_bc + c // fc
            bit = one << np.uint64(b & 63)
            if bits[b >> 6] & bit:
                acc[b] += np.uint64(counts[q])
            else:
                bits[b >> 6] |= bit
                acc[b] = np.uint64(counts[q])
                touched[nt] = b
                nt += 1
        w, vmax = _emit_frame(bits, acc, touched, nt, one, out_idx, out_cnt, w, vmax, table)
        new_ptr[i + 1] = w
    return new_ptr, vmax


@_jit
def _merge_events(ev_ptr, events, n_pixels, t, out_idx, out_cnt, table):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # One count per event; repeated pixels within a frame are summed; pixels
    # summing to less than t are dropped.  Pixels come out sorted and unique.
    # Most pixels of counted data hold one electron: a second bitmap marks the
    # repeated ones, and only they touch the (large) count accumulator.
    # (The caller checks a frame holds fewer than 2**32 events: uint32 counts.)
    n = ev_ptr.shape[0] - 1
    nwords = (n_pixels + 63) // 64
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    acc = np.empty(n_pixels, dtype=np.uint32)
    seen = np.zeros(nwords, dtype=np.uint64)
    dup = np.zeros(nwords, dtype=np.uint64)
    most = 0
    for i in range(n):
        most = max(most, ev_ptr[i + 1] - ev_ptr[i])
    touched = np.empty(min(most, n_pixels), dtype=np.int64)
    one = np.uint64(1)
    db = np.uint64(_DEBRUIJN64)
    shift = np.uint64(58)
    w = 0
    vmax = np.uint64(0)
    for i in range(n):
        nt = 0
        for q in range(ev_ptr[i], ev_ptr[i + 1]):
            b = np.int64(events[q])
            k = b >> 6
            bit = one << np.uint64(b & 63)
            if seen[k] & bit:
                if dup[k] & bit:
                    acc[b] += np.uint32(1)
                else:
                    dup[k] |= bit
                    acc[b] = np.uint32(2)
            else:
                seen[k] |= bit
                touched[nt] = b  # at most n_pixels distinct pixels
                nt += 1
        if nt * 64 < nwords:  # few pixels on a huge detector: sort them
            sel = touched[:nt]
            sel.sort()
            for j in range(nt):
                b = sel[j]
                k = b >> 6
                bit = one << np.uint64(b & 63)
                v = np.uint64(acc[b]) if dup[k] & bit else one
                seen[k] = np.uint64(0)
                dup[k] = np.uint64(0)
                if v >= t:
                    out_idx[w] = b
                    out_cnt[w] = v
                    if v > vmax:
                        vmax = v
                    w += 1
        else:
            for kw in range(nwords):
                word = seen[kw]
                if word != 0:
                    d = dup[kw]
                    seen[kw] = np.uint64(0)
                    dup[kw] = np.uint64(0)
                    base = np.int64(kw) * 64
                    while word != 0:
                        low = word & (~word + one)
                        b = base + table[np.int64((low * db) >> shift)]
                        v = np.uint64(acc[b]) if d & low else one
                        if v >= t:
                            out_idx[w] = b
                            out_cnt[w] = v
                            if v > vmax:
                                vmax = v
                            w += 1
                        word ^= low
        new_ptr[i + 1] = w
    return new_ptr, vmax


# ----------------------------------------------------------------------------- helpers


def _admit(block: np.ndarray) -> None:
    if block.dtype.kind not in "ui":
        raise ParameterError(
            f"the paired representation holds non-negative integer counts, but the data are "
            f"{block.dtype}. Convert explicitly (for example round and cast to an unsigned "
            "integer dtype, recorded by you) or keep the dense representation"
        )


def check_threshold(threshold: Any) -> int | None:
    """Return a valid threshold (a positive integer) or ``None``; raise otherwise."""
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral):
        if (
            not isinstance(threshold, bool)
            and isinstance(threshold, numbers.Real)
            and float(threshold).is_integer()
        ):
            threshold = int(float(threshold))
        else:
            raise ParameterError(
                f"threshold must be a positive integer count (values below it are dropped), "
                f"got {threshold!r}"
            )
    t = int(threshold)
    if t < 1:
        raise ParameterError(
            f"threshold must be >= 1 (values below it are dropped; zeros are never stored), got {t}"
        )
    return t


def _as_frames(block: np.ndarray) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    if block.ndim != 4:
        raise ShapeError(
            f"the paired representation converts (rows, cols, k_r, k_c) blocks, got shape "
            f"{block.shape}"
        )
    R, C, kr, kc = (int(s) for s in block.shape)
    flat = np.ascontiguousarray(block).reshape(R * C, kr * kc)
    if not flat.dtype.isnative:
        flat = flat.astype(flat.dtype.newbyteorder("="))
    return flat, (R, C), (kr, kc)


class Paired(Representation):
    """Electron-counted frames as sorted (pixel index, count) pairs per frame."""

    name: ClassVar[str] = "paired"
    schema: ClassVar[str] = PAIRED_SCHEMA
    native_detector_ops: ClassVar[bool] = True

    def gather(self, payload: Any, indices: np.ndarray) -> np.ndarray:
        """Scatter each frame's events into the gathered pixels (no dense frames made)."""
        require = getattr(payload, "require_applied", None)
        if callable(require):
            require()
        idx = np.asarray(indices, dtype=np.int64)
        n = int(payload.indptr.shape[0]) - 1
        out = np.zeros((n, idx.size), dtype=payload.dtype)
        column = np.full(int(np.prod(payload.frame_shape)), -1, dtype=np.int64)
        column[idx] = np.arange(idx.size)
        frame_of = np.repeat(np.arange(n), np.diff(np.asarray(payload.indptr)))
        col = column[np.asarray(payload.indices, dtype=np.int64)]
        keep = col >= 0
        out[frame_of[keep], col[keep]] = np.asarray(payload.counts)[keep]
        return out

    def from_dense(self, block: np.ndarray, **options: Any) -> PairedPayload:
        """Make the pairs of a dense ``(rows, cols, k_r, k_c)`` block.

        Parameters
        ----------
        block
            Non-negative integer data.
        **options
            ``threshold=`` (only when asked): values below it are dropped,
            which is not lossless; it is stored in the payload, checked by
            :meth:`check` and recorded.  Negative values are then dropped
            too.

        Returns
        -------
        PairedPayload
            The pairs; counts in the smallest unsigned dtype holding the
            block's largest value.

        Raises
        ------
        ParameterError
            Real (floating point) data, negative values without a threshold,
            or an unknown option.
        """
        unknown = set(options) - {"threshold"}
        if unknown:
            raise ParameterError(
                f"unknown option(s) {sorted(unknown)} for the paired representation; it takes "
                "threshold="
            )
        threshold = check_threshold(options.get("threshold"))
        _admit(block)
        flat, scan_shape, frame_shape = _as_frames(block)
        dt = flat.dtype
        info = np.iinfo(dt)
        K = frame_shape[0] * frame_shape[1]
        idx_dtype = index_dtype_for(K)
        t_eff = 1 if threshold is None else threshold
        n = flat.shape[0]
        if t_eff > info.max or flat.size == 0:
            per = np.zeros(n, dtype=np.int64)
            vmax, negative = 0, 0
            if threshold is None and flat.size and dt.kind == "i":
                negative = int(np.count_nonzero(flat < 0))
        else:
            per, vmax_v, neg_v = _count_nonzero(flat, dt.type(t_eff), dt.type(0))
            vmax, negative = int(vmax_v), int(neg_v)
        if negative and threshold is None:
            raise ParameterError(
                f"the paired representation holds non-negative integer counts, but this block "
                f"of {dt} data holds {negative} negative values. Convert explicitly (for example "
                "clip or offset them yourself), pass threshold= to drop values below it "
                "(recorded, not lossless), or keep the dense representation"
            )
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(per, out=indptr[1:])
        m = int(indptr[-1])
        indices = np.empty(m, dtype=idx_dtype)
        counts = np.empty(m, dtype=counts_dtype_for(vmax))
        if m:
            _fill_pairs(flat, dt.type(t_eff), indptr, indices, counts)
        return PairedPayload(
            scan_shape=scan_shape,
            frame_shape=frame_shape,
            indptr=indptr,
            indices=indices,
            counts=counts,
            value_dtype=dt,
            threshold=threshold,
        )

    def to_dense(self, payload: Any) -> np.ndarray:
        """Return the dense ``(rows, cols, k_r, k_c)`` block in ``value_dtype``."""
        p = _payload(payload)
        p.require_applied()
        out = np.zeros((p.n_frames, p.n_pixels), dtype=p.value_dtype)
        if p.n_events:
            _scatter(p.indptr, p.indices, p.counts, out)
        return out.reshape(*p.scan_shape, *p.frame_shape)

    def check(self, dense: np.ndarray, payload: Any, *, full: bool = True) -> dict[str, Any]:
        """Check the pairs against the dense block (thresholded when a threshold was asked).

        Parameters
        ----------
        dense
            The block the payload was made from.
        payload
            The pairs.
        full
            ``True`` compares every value; ``False`` the total and the number
            of non-zero values.

        Returns
        -------
        dict
            What was checked, for provenance; with a threshold it says so,
            with ``"lossless": False`` and how many values (and counts) were
            dropped.

        Raises
        ------
        ConversionError
            If the payload differs from the (thresholded) dense block.
        """
        p = _payload(payload)
        p.require_applied()
        flat, scan_shape, frame_shape = _as_frames(np.asarray(dense))
        if scan_shape != p.scan_shape or frame_shape != p.frame_shape:
            raise ConversionError(
                f"paired conversion is not exact: payload of {p.scan_shape} frames of "
                f"{p.frame_shape} vs dense block {dense.shape}"
            )
        if flat.dtype != p.value_dtype:
            raise ConversionError(
                f"paired conversion is not exact: value dtype {p.value_dtype} vs dense {flat.dtype}"
            )
        if flat.dtype.kind not in "ui":
            raise ConversionError(f"paired payloads hold integers; the dense block is {flat.dtype}")
        t = 1 if p.threshold is None else p.threshold
        info = np.iinfo(flat.dtype)
        t_arg = flat.dtype.type(min(t, int(info.max)))
        differ, e_total, e_nz, g_total, g_nz, dropped, d_total = _compare(
            flat, p.indptr, p.indices, p.counts, t_arg, flat.dtype.type(0)
        )
        if t > info.max:  # every value is below the threshold
            e_total, e_nz = 0.0, 0
            dropped = int(np.count_nonzero(flat))
            d_total = float(flat.sum(dtype=np.float64))
            differ = int(g_nz)
        against = "dense" if p.threshold is None else f"dense thresholded at {p.threshold}"
        if full:
            if differ:
                raise ConversionError(
                    f"paired conversion is not exact: {int(differ)} of {flat.size} values differ "
                    f"from the {against} block"
                )
            record: dict[str, Any] = {"check": "full", "values": int(flat.size)}
        else:
            if e_total != g_total or int(e_nz) != int(g_nz):
                raise ConversionError(
                    f"paired conversion is not exact: totals {e_total} vs {g_total}, non-zero "
                    f"values {int(e_nz)} vs {int(g_nz)} (against the {against} block)"
                )
            record = {"check": "totals", "total": float(e_total), "nonzero": int(e_nz)}
        if p.threshold is not None:
            record.update(
                {
                    "threshold": int(p.threshold),
                    "lossless": False,
                    "note": f"values below {p.threshold} were dropped (threshold asked for)",
                    "dropped_values": int(dropped),
                    "dropped_total": float(d_total),
                }
            )
        else:
            record["lossless"] = True
        return record

    def apply_detector_ops(self, payload: Any, ops: tuple[Any, ...]) -> PairedPayload:
        """Crop and bin on the pairs, never densifying.

        Crops remap indices and drop pairs outside the region; binning sums
        the counts of each bin (partial edge bins kept), merges them per frame
        and widens ``value_dtype`` like
        :func:`~quantem_flow.representations.detector_ops.binned_dtype`;
        the counts dtype is chosen again for the largest merged count.  A
        pending threshold (from a native read) is applied last, to the values
        as transformed, as a conversion from dense would.
        """
        p = _payload(payload)
        for op in ops:
            if op.kind == "crop":
                p = crop_pairs(p, tuple(int(v) for v in op.params))  # type: ignore[arg-type]
            elif op.kind == "bin":
                p = bin_pairs(p, (int(op.params[0]), int(op.params[1])))
            else:
                raise ParameterError(
                    f"unknown detector transform {op.kind!r}; expected crop or bin"
                )
        if p.pending_threshold is not None:
            p = threshold_pairs(dataclasses.replace(p, pending_threshold=None), p.pending_threshold)
        return p


def _payload(payload: Any) -> PairedPayload:
    if not isinstance(payload, PairedPayload):
        raise ParameterError(
            f"expected a PairedPayload (paired representation), got {type(payload).__name__}"
        )
    return payload


def crop_pairs(p: PairedPayload, region: tuple[int, int, int, int]) -> PairedPayload:
    """Keep the half-open detector region ``(r0, r1, c0, c1)`` of every frame (O(pairs))."""
    r0, r1, c0, c1 = region
    kr, kc = p.frame_shape
    if not (0 <= r0 < r1 <= kr and 0 <= c0 < c1 <= kc):
        raise ShapeError(
            f"detector region {region} is empty or outside the {kr} x {kc} frame; regions are "
            "half-open (row_start, row_stop, col_start, col_stop)"
        )
    new_shape = (r1 - r0, c1 - c0)
    m = p.n_events
    out_idx = np.empty(m, dtype=index_dtype_for(new_shape[0] * new_shape[1]))
    out_cnt = np.empty(m, dtype=p.counts.dtype)
    new_ptr, vmax = _crop_pairs(p.indptr, p.indices, p.counts, kc, r0, r1, c0, c1, out_idx, out_cnt)
    w = int(new_ptr[-1])
    dt = counts_dtype_for(int(vmax))  # the region's largest count may need fewer bytes
    return PairedPayload(
        scan_shape=p.scan_shape,
        frame_shape=new_shape,
        indptr=new_ptr,
        indices=out_idx[:w].copy() if w < m else out_idx,
        counts=out_cnt[:w].astype(dt) if (w < m or dt != out_cnt.dtype) else out_cnt,
        value_dtype=p.value_dtype,
        threshold=p.threshold,
        pending_threshold=p.pending_threshold,
    )


def bin_pairs(p: PairedPayload, factor: tuple[int, int]) -> PairedPayload:
    """Sum ``factor`` detector pixels into one on the pairs, keeping partial edge bins.

    Matches :func:`~quantem_flow.representations.detector_ops.bin_frames`
    exactly: the bins are ``ceil(k / f)`` per axis and ``value_dtype`` widens
    like :func:`~quantem_flow.representations.detector_ops.binned_dtype`.
    """
    from .detector_ops import binned_dtype

    fr, fc = factor
    if fr < 1 or fc < 1:
        raise ParameterError(f"bin factor must be positive, got {factor}")
    kr, kc = p.frame_shape
    new_shape = (-(-kr // fr), -(-kc // fc))
    n_new = new_shape[0] * new_shape[1]
    value_dtype = binned_dtype(p.value_dtype)
    m = p.n_events
    out_idx = np.empty(m, dtype=index_dtype_for(n_new))
    out_cnt = np.empty(m, dtype=np.uint64)
    new_ptr, vmax_v = _bin_pairs(
        p.indptr, p.indices, p.counts, kc, fr, fc, new_shape[1], n_new, out_idx, out_cnt, _CTZ_TABLE
    )
    vmax = int(vmax_v)
    if vmax > int(np.iinfo(value_dtype).max):
        raise ParameterError(
            f"binning by {factor} makes a count of {vmax}, more than the binned dtype "
            f"{value_dtype} holds; bin by a smaller factor"
        )
    w = int(new_ptr[-1])
    return PairedPayload(
        scan_shape=p.scan_shape,
        frame_shape=new_shape,
        indptr=new_ptr,
        indices=out_idx[:w].copy() if w < m else out_idx,
        counts=out_cnt[:w].astype(counts_dtype_for(vmax)),
        value_dtype=value_dtype,
        threshold=p.threshold,
        pending_threshold=p.pending_threshold,
    )


def pairs_from_events(
    ev_ptr: np.ndarray,
    events: np.ndarray,
    scan_shape: tuple[int, int],
    frame_shape: tuple[int, int],
    value_dtype: np.dtype[Any] | str,
    *,
    threshold: int | None = None,
) -> PairedPayload:
    """Make pairs from electron events (one count per event), O(events).

    Parameters
    ----------
    ev_ptr
        ``int64 (n_frames + 1,)``: the events of frame ``i`` are
        ``events[ev_ptr[i]:ev_ptr[i+1]]``.
    events
        Flat pixel index ``r * k_c + c`` of each event, in any order within a
        frame; a pixel repeated ``k`` times holds the count ``k``.  Every
        index must lie in ``[0, k_r * k_c)`` (checked by the caller).
    scan_shape, frame_shape
        Shape of the chunk.
    value_dtype
        Logical dtype of the values (unsigned integer).
    threshold
        Drop pixels whose count is below it (only when asked; recorded in
        the payload).

    Raises
    ------
    ParameterError
        If a count does not fit in ``value_dtype``.
    """
    t = check_threshold(threshold)
    vdt = np.dtype(value_dtype)
    K = int(frame_shape[0]) * int(frame_shape[1])
    ev_ptr = np.ascontiguousarray(ev_ptr, dtype=np.int64)
    m = int(events.shape[0])
    if ev_ptr.shape[0] > 1 and int(np.diff(ev_ptr).max()) >= 2**32:
        raise ParameterError("a frame holds 2**32 events or more; split it before pairing")
    out_idx = np.empty(m, dtype=index_dtype_for(K))
    out_cnt = np.empty(m, dtype=np.uint64)
    new_ptr, vmax_v = _merge_events(
        ev_ptr,
        np.ascontiguousarray(events),
        K,
        np.uint64(1 if t is None else t),
        out_idx,
        out_cnt,
        _CTZ_TABLE,
    )
    vmax = int(vmax_v)
    if vmax > int(np.iinfo(vdt).max):
        raise ParameterError(
            f"a pixel holds {vmax} counts in one frame, more than the value dtype {vdt} holds "
            f"({int(np.iinfo(vdt).max)})"
        )
    w = int(new_ptr[-1])
    return PairedPayload(
        scan_shape=scan_shape,
        frame_shape=frame_shape,
        indptr=new_ptr,
        indices=out_idx[:w].copy() if w < m else out_idx,
        counts=out_cnt[:w].astype(counts_dtype_for(vmax)),
        value_dtype=vdt,
        threshold=t,
    )


def threshold_pairs(p: PairedPayload, threshold: int) -> PairedPayload:
    """Drop the pairs whose value is below ``threshold`` (recorded in the payload; O(pairs))."""
    t = check_threshold(threshold)
    if t is None:
        return p
    p.require_applied()
    keep = p.counts >= t
    cum = np.zeros(p.n_events + 1, dtype=np.int64)
    np.cumsum(keep, out=cum[1:])
    counts = p.counts[keep]
    vmax = int(counts.max()) if counts.size else 0
    return PairedPayload(
        scan_shape=p.scan_shape,
        frame_shape=p.frame_shape,
        indptr=cum[p.indptr],
        indices=p.indices[keep],
        counts=counts.astype(counts_dtype_for(vmax), copy=False),
        value_dtype=p.value_dtype,
        threshold=t if p.threshold is None else max(t, p.threshold),
    )
