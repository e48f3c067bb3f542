"""The structured rows of 8/16-bit frames as integer dot products (:mod:`.dot_ir`).

A :class:`~quantem_flow.runtimes.cpu.structure.WeightPlan` whose rows are
all masks and moments (BF, ABF, ADF, annuli, the maps of a centre of mass)
asks, per frame, for sums of the frame over supports and first moments
``sum M * (g - origin)`` (``origin`` the detector's middle pixel).  Each is
a dot product of the frame with a small integer vector: 0/1 over the
support, or the support times the row (column) offset from the middle.
:class:`DotPass` builds those vectors once (identical ones once: BF + ADF +
CoM needs five: BF, ADF, the CoM support, its row and its column moment),
computes them with the SIMD kernel of :mod:`.dot_ir`, and writes the same
integers the cell kernels of :mod:`.structure` accumulate into the same
output columns, so :func:`~quantem_flow.runtimes.cpu.structure.finish_moment_rows`
finishes them the same way and every value is bit for bit the structured
kernel's (tests/test_dot_pass.py).

Where the cell kernels read only the pixels of some support, the vectors
span the whole frame: a pixel outside every support costs a multiply-add by
zero.  The kernel still does less per pixel (one instruction per vector per
32 pixels, against a widening, an add and, with moments, a multiply per 16)
and measured 1.9x the cell kernels on BF + ADF + CoM over 128 x 128 u16
frames in L2, 1.5-2.1x on 3-10 annuli (benchmarks/RESULTS.md, "Integer dot
products"; docs/integer-dot-kernel.md).

When it runs
------------
8- and 16-bit integer frames, every row a mask or a moment (no general
rows), no sum or maximum pattern asked for, weights within 16 bits (moment
coordinates below 32768 pixels), an x86-64 CPU with AVX2 or AVX-512 BW, and
the setting ``integer_dot_kernel`` on (the default).  Otherwise the cell
kernels run, and the variant record says why not.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ... import config
from ...errors import DtypeError, ShapeError
from .dot_ir import PARAMS, DotISA, DotKernel, compile_dot_kernel, host_isa, steps_per_widening
from .row_hash import RowHasher
from .structure import _KIND_SUM, WeightPlan, structured_vectors

__all__ = ["DotPass", "dot_pass_for"]

_ELEMENTS = {"uint16": "u16", "int16": "i16", "uint8": "u8", "int8": "i8"}


def _max_vectors(isa: DotISA) -> tuple[int, int]:
    """Accumulators a kernel may keep in registers: (frames at once, vectors per group).

    32 vector registers with AVX-512 (4 frames x 6 vectors leaves room for the
    pixels and one weight vector), 16 with AVX2.
    """
    return (4, 6) if isa.bits == 512 else (2, 5)


class DotPass:
    """The structured rows of one plan as integer dot products (see the module docstring).

    Parameters
    ----------
    plan
        The weight plan (structured, no general rows).
    dtype
        8- or 16-bit integer frames.
    isa
        The vector instructions to compile for.
    """

    def __init__(self, plan: WeightPlan, dtype: np.dtype[Any], isa: DotISA) -> None:
        self.plan = plan
        self.dtype = np.dtype(dtype)
        self.element = _ELEMENTS[self.dtype.name]
        self.isa = isa
        k = plan.frame_shape[0] * plan.frame_shape[1]
        vectors: list[np.ndarray] = []
        keys: dict[bytes, int] = {}

        def index(vec: np.ndarray) -> int:  # identical vectors are computed once
            key = vec.tobytes()
            if key not in keys:
                keys[key] = len(vectors)
                vectors.append(vec)
            return keys[key]

        program: list[tuple[int, int, int, float]] = []  # dst, src, sub, off
        entries = iter(structured_vectors(plan))
        for q in range(plan.srow_kind.size):
            vec, column = next(entries)
            if int(plan.srow_kind[q]) == _KIND_SUM:
                program.append((column, index(vec), -1, 0.0))
                continue
            moment = index(vec)
            sum_vec, sum_column = next(entries)
            total = index(sum_vec)
            program.append((sum_column, total, -1, 0.0))
            program.append((column, moment, total, float(plan.srow_offset[q])))
        stack = np.stack(vectors) if vectors else np.zeros((0, k), dtype=np.int64)
        self.max_abs_weight = int(np.abs(stack).max()) if stack.size else 0
        # only the pixels from the first to the last nonzero weight are read
        nonzero = np.flatnonzero(stack.any(axis=0))
        self.first_pixel = int(nonzero[0]) if nonzero.size else 0
        self.frame_pixels = int(nonzero[-1]) + 1 - self.first_pixel if nonzero.size else 1
        lanes = isa.lanes
        steps = max(1, -(-self.frame_pixels // lanes))
        self.weights = np.zeros((len(vectors), steps * lanes), dtype=np.int16)
        self.weights[:, : self.frame_pixels] = stack[
            :, self.first_pixel : self.first_pixel + self.frame_pixels
        ]
        flip = 0x8000 if self.element == "u16" else 0
        # sum_p w * x = sum_p w * (x ^ 0x8000) + 32768 * sum_p w for unsigned 16-bit pixels
        self.correction = np.ascontiguousarray(stack.sum(axis=1) * (32768 if flip else 0))
        self.block = steps_per_widening(self.element, max(self.max_abs_weight, 1))
        frames_at_once, per_group = _max_vectors(isa)
        n = len(vectors)
        self.groups = [(j, min(j + per_group, n)) for j in range(0, n, per_group)]
        self.frames_at_once = frames_at_once
        arr = np.array(program, dtype=np.float64).reshape(-1, 4)
        self._dst = np.ascontiguousarray(arr[:, 0].astype(np.int64))
        self._src = np.ascontiguousarray(arr[:, 1].astype(np.int64))
        self._sub = np.ascontiguousarray(arr[:, 2].astype(np.int64))
        self._off = np.ascontiguousarray(arr[:, 3])
        self.n_out = int(self._dst.max()) + 1 if self._dst.size else 0

        def params(j0: int, count: int) -> np.ndarray:
            values = {
                "weights": self.weights[j0:].ctypes.data,
                "steps": steps,
                "flip": flip,
                "block": self.block,
                "tail": self.frame_pixels - (steps - 1) * lanes,
                "correction": self.correction[j0:].ctypes.data,
                "totals_stride": n,
                "count": count,
                "dst": self._dst.ctypes.data,
                "src": self._src.ctypes.data,
                "sub": self._sub.ctypes.data,
                "off": self._off.ctypes.data,
            }
            return np.array([values[name] for name in PARAMS], dtype=np.int64)

        single = len(self.groups) == 1
        self._params = [params(j0, len(program) if single else 0) for j0, _ in self.groups]
        self._finish_params = params(0, len(program))
        # addresses asked once (an array's .ctypes costs a microsecond per call)
        self._params_at = [int(p.ctypes.data) for p in self._params]
        self._finish_at = int(self._finish_params.ctypes.data)
        self._kernels: list[DotKernel] | None = None
        self._scratch = threading.local()

    @property
    def n_vectors(self) -> int:
        """Distinct weight vectors (dot products per frame)."""
        return int(self.weights.shape[0])

    def kernels(self) -> list[DotKernel]:
        """The compiled kernels, one per group of vectors (compiled on first use)."""
        if self._kernels is None:
            self._kernels = [
                compile_dot_kernel(self.element, j1 - j0, self.frames_at_once, self.isa)
                for j0, j1 in self.groups
            ]
        return self._kernels

    def describe(self) -> str:
        """One line for the variant record: vectors, pixels read, instruction, widening."""
        k = self.plan.frame_shape[0] * self.plan.frame_shape[1]
        return (
            f"integer dot products: {self.n_vectors} vectors over pixels {self.first_pixel} "
            f"to {self.first_pixel + self.frame_pixels} of {k} ({self.isa.instruction}, "
            f"{self.isa.lanes} pixels per instruction, {self.frames_at_once} frames per step, "
            f"32-bit lanes widened every {self.block} steps)"
        )

    def run(self, frames: np.ndarray, out: np.ndarray, *, hasher: RowHasher | None = None) -> None:
        """Write the plan's structured columns of ``out`` for ``(n, K)`` ``frames``.

        ``out`` is float64 ``(n, >= plan.n_out)`` with contiguous rows; every
        structured column is written finished (moment rows included), as
        :func:`~quantem_flow.runtimes.cpu.structure.structured_pass` leaves it.
        ``hasher``: the frames' scan-row digests advance in the kernel's sweep
        (each group of frames hashed right after its dot products).
        """
        n = frames.shape[0]
        if n == 0 or self.n_vectors == 0:
            return
        k = self.plan.frame_shape[0] * self.plan.frame_shape[1]
        if frames.ndim != 2 or frames.shape[1] != k:
            raise ShapeError(
                f"frames must be (n, {k}) for this pass (detector {self.plan.frame_shape}), "
                f"got {frames.shape}; reshape the frames to one row of pixels each"
            )
        if frames.dtype != self.dtype:
            raise DtypeError(
                f"frames are {frames.dtype.str} ({frames.dtype.name}), this pass was prepared "
                f"for {self.dtype.str} ({self.dtype.name}) frames; prepare a pass for "
                f"{frames.dtype.str}"
            )
        if frames.strides[1] != frames.itemsize:
            frames = np.ascontiguousarray(frames)
        if out.dtype != np.float64 or out.shape[0] < n or out.shape[1] < self.n_out:
            raise ShapeError(
                f"out must be float64 of at least ({n}, {self.n_out}), got {out.dtype} {out.shape}"
            )
        if out.strides[1] != 8:
            raise ShapeError(f"out must have contiguous rows, got strides {out.strides}")
        totals_at = self._totals_at(n)
        back = self.first_pixel * frames.itemsize
        base = frames.ctypes.data + back
        stride = frames.strides[0]
        hashed = 0 if hasher is None else hasher.kernel_block(frames, back=back)
        kernels = self.kernels()
        if len(kernels) == 1:
            kernels[0].run(
                base,
                n,
                stride,
                out.ctypes.data,
                out.strides[0] // 8,
                totals_at,
                self._params_at[0],
                hashed,
            )
            return
        for g, ((j0, _), kernel, params) in enumerate(
            zip(self.groups, kernels, self._params_at, strict=True)
        ):
            # the first group's sweep hashes the frames; the others read them from cache
            kernel.run(
                base,
                n,
                stride,
                0,
                0,
                totals_at + 8 * j0,
                params,
                hashed if g == 0 else 0,
            )
        kernels[0].finish(
            0,
            n,
            0,
            out.ctypes.data,
            out.strides[0] // 8,
            totals_at,
            self._finish_at,
            0,
        )

    def _totals_at(self, n: int) -> int:
        """The address of a reused C-contiguous ``(n, n_vectors)`` int64 buffer of this thread."""
        buf = getattr(self._scratch, "totals", None)
        if buf is None or buf.shape[0] < n:
            buf = np.empty((max(n, 64), self.n_vectors), dtype=np.int64)
            self._scratch.totals = buf
            self._scratch.totals_at = int(buf.ctypes.data)
        return int(self._scratch.totals_at)


_cache: dict[tuple[int, str, DotISA], tuple[WeightPlan, DotPass | None, str]] = {}
_cache_lock = threading.Lock()


def holds_pass(
    plan: WeightPlan, dtype: np.dtype[Any], *, want_patterns: bool, dot: DotPass | None
) -> bool:
    """Whether :func:`dot_pass_for` would still give ``dot`` (``None``: no dot pass).

    A plan it refuses outright (general rows, patterns asked for, the setting
    off) is refused again; otherwise its cache must still hold ``dot`` itself.
    """
    dt = np.dtype(dtype)
    if _why_not(plan, dt, want_patterns=want_patterns) is not None or host_isa() is None:
        return dot is None  # refused before the cache: refused again
    with _cache_lock:
        found = [d for key, (p, d, _) in _cache.items() if p is plan and key[1] == dt.str]
    return bool(found) and found[0] is dot


def _why_not(plan: WeightPlan, dt: np.dtype[Any], *, want_patterns: bool) -> str | None:
    """Why the dot kernel cannot run ``plan`` on ``dt`` frames, or ``None`` if it can."""
    if not config.get("integer_dot_kernel"):
        return "integer dot kernel off (setting integer_dot_kernel)"
    if dt.name not in _ELEMENTS:
        return f"integer dot kernel: {dt.name} frames (8/16-bit integers only)"
    if not dt.isnative:
        return f"integer dot kernel: {dt.str} frames are not in native byte order"
    if plan.general.size:
        return f"integer dot kernel: {plan.general.size} general rows"
    if want_patterns:
        return "integer dot kernel: a sum or maximum pattern is asked for"
    if plan.need_moments and 2 * max(plan.frame_shape) > 32767:
        return f"integer dot kernel: detector {plan.frame_shape} too wide for 16-bit moment weights"
    return None


def dot_work(plan: WeightPlan, dtype: np.dtype[Any]) -> int | None:
    """Multiply-adds per frame of the dot kernel :func:`dot_pass_for` would choose, else ``None``.

    The same checks and the same choice, without compiling anything or
    keeping the pass (a cost estimate: :mod:`.pass_cost`).
    """
    dt = np.dtype(dtype)
    chosen = host_isa()
    if _why_not(plan, dt, want_patterns=False) is not None or chosen is None:
        return None
    dp = DotPass(plan, dt, chosen)
    use, _ = _worth_it(dp)
    return dp.n_vectors * dp.frame_pixels if use else None


def dot_pass_for(
    plan: WeightPlan,
    dtype: np.dtype[Any],
    *,
    want_patterns: bool,
    isa: DotISA | None = None,
) -> tuple[DotPass | None, str]:
    """The :class:`DotPass` for ``plan`` on ``dtype`` frames, or ``None`` and why not.

    ``isa`` defaults to the host's (:func:`~quantem_flow.runtimes.cpu.dot_ir.host_isa`);
    passes are cached per plan (plans are cached by content).
    """
    dt = np.dtype(dtype)
    why_not = _why_not(plan, dt, want_patterns=want_patterns)
    if why_not is not None:
        return None, why_not
    chosen = isa if isa is not None else host_isa()
    if chosen is None:
        return None, "integer dot kernel: this CPU has no AVX2 (x86-64 only)"
    key = (id(plan), dt.str, chosen)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is plan:  # the plan itself: ids of dead plans are reused
            return hit[1], hit[2]
    dp: DotPass | None = DotPass(plan, dt, chosen)
    assert dp is not None
    use, why = _worth_it(dp)
    if use:
        try:
            dp.kernels()  # compiled here (~0.1 s once per shape of kernel), not mid-pass
            why = f"{dp.describe()}; {why}"
        except Exception as exc:  # an llvmlite without what the kernel needs: recorded
            dp, why = (
                None,
                (f"integer dot kernel could not be compiled ({type(exc).__name__}: {exc})"),
            )
    else:
        dp = None
    with _cache_lock:  # rejected plans too: the next chunk does not build the vectors again
        _cache[key] = (plan, dp, why)
        while len(_cache) > 32:
            _cache.pop(next(iter(_cache)))
    return dp, why


#: The dot kernel runs when its multiply-adds (vectors x pixels read) are at most this
#: many times the cell kernels' estimated pixel-steps (structure.py's cost model), and
#: at least MIN_VECTOR_PIXELS (below, its fixed cost per frame dominates).  Calibrated
#: on 128 x 128 u16 frames in L2 (this project's VM, Zen 4 with AVX-512 VNNI;
#: benchmarks/RESULTS.md "Integer dot products"): 3-10 annuli 1.2-1.8x the cell
#: kernels (ratios 4.5-5.5), BF + ADF + CoM 1.9x (3.8), one BF disk 0.87x (5001 vector
#: pixels), 20 annuli 0.95-1.1x (7.3).
DOT_PER_CELL_STEP = 6.0
MIN_VECTOR_PIXELS = 8192


def _worth_it(dp: DotPass) -> tuple[bool, str]:
    cells = dp.plan.cell_cost()
    work = dp.n_vectors * dp.frame_pixels
    numbers = (
        f"{dp.n_vectors} vectors x {dp.frame_pixels} pixels = {work} multiply-adds per frame "
        f"against the cell kernels' {cells:.0f} pixel-steps"
    )
    if work < MIN_VECTOR_PIXELS:
        return False, f"integer dot kernel: {numbers}, under {MIN_VECTOR_PIXELS}: cell kernels"
    if work > DOT_PER_CELL_STEP * cells:
        return False, (
            f"integer dot kernel: {numbers}, more than {DOT_PER_CELL_STEP:g}x: cell kernels"
        )
    return True, f"chosen: {numbers} (at most {DOT_PER_CELL_STEP:g}x)"
