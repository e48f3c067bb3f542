"""The CPU runtime's SSB array adapter: NumPy/SciPy FFTs and a compiled trotter loop.

The contract is :class:`~quantem_flow.runtimes.array_ops.ArrayOps`; the
stage that uses it is :mod:`quantem_flow.operators.ssb.stages`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from ..array_ops import Aberrations, ArrayOps, PartialSums
from ..host_arrays import fresh_zeros
from .trotter_ir import trotter_kernel

__all__ = ["SPECTRA_SUB_BLOCK", "NumpyOps"]

#: Pixels the CPU adapter transforms together inside a block (small enough that its
#: buffers stay in cache; the result does not depend on it).
SPECTRA_SUB_BLOCK = 8


def _trotter_loop(
    f: Any,
    vr: Any,
    vc: Any,
    m: Any,
    qr: Any,
    qc: Any,
    er: Any,
    ec: Any,
    phase: bool,
    s1: Any,
    s2: Any,
    counts: Any,
    e1: Any,
    e2: Any,
) -> None:  # pragma: no cover - the reference of trotter_ir.py (tests compile it)
    n, nr, nc = f.shape
    for p in range(n):
        for i in range(nr):
            for j in range(nc):
                q2 = qr[i] * qr[i] + qc[j] * qc[j]
                two_dot = 2.0 * (vr[p] * qr[i] + vc[p] * qc[j])
                in_minus = (q2 - two_dot) < m[p]
                in_plus = (q2 + two_dot) < m[p]
                if in_minus == in_plus:
                    continue
                z = f[p, i, j]
                power = z.real * z.real + z.imag * z.imag
                x = z * (er[p, i] * ec[p, j]) if phase else z
                if in_minus:
                    s1[i, j] += x
                    counts[0, i, j] += 1
                    e1[i, j] += power
                else:
                    s2[i, j] += x
                    counts[1, i, j] += 1
                    e2[i, j] += power


class NumpyOps(ArrayOps):
    """NumPy arrays, SciPy's pocketfft with ``workers`` threads; float64/complex128."""

    takes_workers: ClassVar[bool] = True

    name: ClassVar[str] = "cpu"
    precision: ClassVar[str] = "float64 data, complex128 FFT and sums"

    def __init__(self, workers: int | None = None) -> None:
        import os

        self.workers = int(workers or os.cpu_count() or 1)
        self.real_dtype = np.float64
        self.complex_dtype = np.complex128

    def asarray(self, a: np.ndarray) -> Any:
        """Host array as float64 (complex input stays complex128)."""
        if np.iscomplexobj(a):
            return np.asarray(a, dtype=np.complex128)
        return np.asarray(a, dtype=np.float64)

    def normalise(self, block: np.ndarray, inv_mean: np.ndarray) -> Any:
        """In place on a fresh float64 copy (never on the caller's block)."""
        x = np.array(block, dtype=np.float64, copy=True)
        x *= np.asarray(inv_mean, dtype=np.float64).reshape(-1, 1, 1)
        x -= 1.0
        return x

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """``scipy.fft.rfft2`` with ``workers`` threads (SciPy's pocketfft: :mod:`.pocketfft`)."""
        from . import pocketfft

        return pocketfft.rfft2(x, s=shape, axes=(-2, -1), workers=self.workers)

    def exp_i(self, phase: Any) -> Any:
        """``cos + i sin`` in complex128."""
        out = np.empty(np.shape(phase), dtype=np.complex128)
        np.cos(phase, out=out.real)
        np.sin(phase, out=out.imag)
        return out

    def real(self, z: Any) -> Any:
        """Real part."""
        return np.real(z)

    def abs2(self, z: Any) -> Any:
        """``re^2 + im^2``."""
        return z.real * z.real + z.imag * z.imag

    def where(self, mask: Any, a: Any) -> Any:
        """``np.where(mask, a, 0)``."""
        return np.where(mask, a, 0)

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        return np.sum(x, axis=0)

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """``np.take``."""
        return np.take(x, index, axis=axis)

    def to_host(self, x: Any) -> np.ndarray:
        """Identity (already host)."""
        return np.asarray(x)

    def band_spectra(self, block: np.ndarray, inv_mean: np.ndarray, grid: Any) -> Any:
        """:func:`spectra` with the FFT pruned to the band, in float64/complex128.

        ``I * (inv_mean / N)`` is made in float64; the real FFT runs over the
        columns, only the band's columns (``q_c < 2 alpha``, a prefix of the
        half plane) go through the FFT over the rows, and only the band's
        rows are kept: the same transform as ``rfft2`` (pocketfft also
        transforms the last axis first) on about half the data in the second
        step.  Pixels go :data:`SPECTRA_SUB_BLOCK` at a time through reused
        buffers (cache-sized, no fresh pages per block).  Without padding the
        ``- 1`` is applied to the zero frequency afterwards (the FFT of a
        constant is a delta there), which saves a pass; with ``pad_to`` it is
        subtracted before padding.
        """
        n = int(block.shape[0])
        nr, nc = int(np.asarray(grid.rows).size), int(np.asarray(grid.cols).size)
        out = fresh_zeros((n, nr, nc), np.complex128)  # huge pages: fewer first-touch faults
        if n == 0 or nr == 0 or nc == 0:
            return out
        for s, e, spec in self._sub_block_spectra(block, inv_mean, grid):
            out[s:e] = spec
        return out

    def _sub_block_spectra(
        self, block: np.ndarray, inv_mean: np.ndarray, grid: Any
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(start, stop, spectra)`` of :data:`SPECTRA_SUB_BLOCK` pixels at a time.

        The spectra are a view of one reused ``(SPECTRA_SUB_BLOCK, rows, cols)``
        buffer, overwritten by the next sub-block: use them before asking for it.
        """
        from . import pocketfft

        Rp, Cp = grid.fft_shape
        scale = 1.0 / (Rp * Cp)
        n, R, C = (int(v) for v in block.shape)
        rows = np.asarray(grid.rows)
        cols = np.asarray(grid.cols)
        nr, nc = int(rows.size), int(cols.size)
        if n == 0 or nr == 0 or nc == 0:
            return
        padded = (Rp, Cp) != (R, C)
        prefix = np.array_equal(cols, np.arange(nc))
        # the band's rows in FFT order: non-negative frequencies, then negative ones
        low = int(np.count_nonzero(rows < (Rp + 1) // 2))
        split = np.array_equal(rows[:low], np.arange(low)) and np.array_equal(
            rows[low:], np.arange(Rp - (nr - low), Rp)
        )
        centre = not padded and rows[0] == 0 and cols[0] == 0
        inv = np.asarray(inv_mean, dtype=np.float64) * scale
        sub = max(1, min(SPECTRA_SUB_BLOCK, n))
        x = np.empty((sub, R, C), dtype=np.float64)
        band = np.empty((sub, nr, nc), dtype=np.complex128)
        for s in range(0, n, sub):
            e = min(n, s + sub)
            xs, out = x[: e - s], band[: e - s]
            np.multiply(block[s:e], inv[s:e].reshape(-1, 1, 1), out=xs)
            if padded:
                xs -= scale
            f = pocketfft.rfft(xs, n=Cp, axis=-1, workers=self.workers)
            f = f[:, :, :nc] if prefix else np.take(f, cols, axis=2)
            f = pocketfft.fft(f, n=Rp, axis=1, workers=self.workers, overwrite_x=True)
            if split:
                out[:, :low] = f[:, :low]
                out[:, low:] = f[:, Rp - (nr - low) :]
            else:
                np.take(f, rows, axis=1, out=out)
            if centre:
                out[:, 0, 0] -= 1.0
            yield s, e, out

    def band_trotter_sums(
        self,
        block: np.ndarray,
        inv_mean: np.ndarray,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: Any,
        ab: Aberrations,
        wavelength_A: float,
    ) -> PartialSums | None:
        """:meth:`band_spectra` then :meth:`trotter_sums`, a sub-block of pixels at a time.

        Each :data:`SPECTRA_SUB_BLOCK` pixels' spectra go through the trotter
        loop while they are in cache, into sums carried from one sub-block to
        the next: every frequency's sums add the pixels in the same order, so
        the values are those of the two steps apart, bit for bit, without the
        block's ``(pixels, rows, cols)`` spectra in memory (35 MB of fresh
        pages per 256 pixels here, 0.1 s of first-touch faults in a fresh
        process).  ``None`` where :meth:`trotter_sums` would be.
        """
        loop = self._trotter_loop(v_r, v_c, grid, ab, wavelength_A)
        if loop is None:
            return None
        for s, e, spec in self._sub_block_spectra(block, inv_mean, grid):
            loop.add(spec, s, e)
        return loop.finish()

    def trotter_sums(
        self,
        spec: Any,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: Any,
        ab: Aberrations,
        wavelength_A: float,
    ) -> PartialSums | None:
        """:func:`accumulate` in one compiled loop (no aberrations, or only C10 and C12).

        The masks, phase ramps and sums are those of the generic code,
        evaluated per (pixel, frequency) with the same float64 expressions
        and summed over pixels in the same order, without the
        ``(pixels, rows, cols)`` temporaries.  Higher-order aberrations use
        the generic code (``None``).
        """
        loop = self._trotter_loop(v_r, v_c, grid, ab, wavelength_A)
        if loop is None:
            return None
        loop.add(np.asarray(spec), 0, int(v_r.size))
        return loop.finish()

    def _trotter_loop(
        self,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: Any,
        ab: Aberrations,
        wavelength_A: float,
    ) -> _TrotterSums | None:
        """Running trotter sums over the pixels ``v_r, v_c``, or ``None`` (higher orders)."""
        if not (ab.is_zero or ab.is_quadratic):
            return None
        return _TrotterSums(v_r, v_c, grid, ab, wavelength_A, self.exp_i)

    def describe(self) -> dict[str, Any]:
        """Runtime, precision and FFT library."""
        from . import pocketfft

        return {
            "runtime": self.name,
            "precision": self.precision,
            "fft": f"{pocketfft.backend_name()}, workers={self.workers}",
            "spectra": "rfft over scan columns, then fft over scan rows of the band's columns "
            "only (pruned rfft2), float64/complex128",
            "accumulation": "one compiled loop (LLVM IR, no fast-math) over pixels x band "
            "frequencies for no "
            "or quadratic (C10, C12) aberrations, float64/complex128, pixels summed in order; "
            "NumPy arrays for higher orders",
        }

    @classmethod
    def prewarm(cls) -> threading.Thread | None:
        """Load SciPy's FFT and compile the trotter loop in a background thread.

        Started when the SSB plan is made, the FFT's load (its pocketfft
        extension alone, 0.02 s: :mod:`.pocketfft`; the ``scipy.fft`` package
        where that cannot load, 0.2-0.3 s) and the compile (:mod:`.trotter_ir`,
        about 0.02 s) overlap the gather pass instead of adding to the SSB
        stage, whose own calls wait for them on the loader's lock and the
        kernel's lock.  Values do not depend on it.
        """

        def load() -> None:
            from . import pocketfft

            if pocketfft.extension() is None:
                import scipy.fft  # noqa: F401  (0.2-0.3 s in a fresh interpreter)

            f = np.zeros((1, 1, 1), dtype=np.complex128)
            one = np.zeros(1)
            e = np.ones((1, 1), dtype=np.complex128)
            z = np.zeros((1, 1))
            trotter_kernel()(
                f, one, one, one, one, one, e, e, True, f[0].copy(), f[0].copy(),
                np.zeros((2, 1, 1), dtype=np.int64), z, z.copy(),
            )  # fmt: skip

        thread = threading.Thread(target=load, name="qf-ssb-prewarm", daemon=True)
        thread.start()
        return thread


class _TrotterSums:
    """The trotter loop's sums over a block's pixels, added a run of pixels at a time.

    The loop adds each pixel into the running sums in order, so adding
    pixels ``[0, 8)`` then ``[8, 16)`` gives the bits of one call on
    ``[0, 16)``.
    """

    def __init__(
        self,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: Any,
        ab: Aberrations,
        wavelength_A: float,
        exp_i: Callable[[Any], Any],
    ) -> None:
        nr, nc = grid.band_shape
        self.grid, self.ab, self.wavelength_A = grid, ab, wavelength_A
        self.out = PartialSums.zeros((nr, nc))
        self.counts = np.zeros((2, nr, nc), dtype=np.int64)
        self.vr = np.ascontiguousarray(v_r, dtype=np.float64)
        self.vc = np.ascontiguousarray(v_c, dtype=np.float64)
        self.m = grid.alpha_rad**2 - self.vr * self.vr - self.vc * self.vc
        self.qr = np.ascontiguousarray(grid.q_r, dtype=np.float64)
        self.qc = np.ascontiguousarray(grid.q_c, dtype=np.float64)
        self.phase = not ab.is_zero
        if self.phase:
            c10, c12a, c12b = ab.quadratic_form()
            k = -2.0 * math.pi / wavelength_A
            u_r = c10 * self.vr + c12a * (-self.vr) + c12b * self.vc
            u_c = c10 * self.vc + c12a * self.vc + c12b * self.vr
            self.er = exp_i(k * u_r[:, None] * grid.q_r[None, :])
            self.ec = exp_i(k * u_c[:, None] * grid.q_c[None, :])
        else:
            self.er = self.ec = np.ones((1, 1), dtype=np.complex128)

    def add(self, spec: np.ndarray, start: int, stop: int) -> None:
        """Add the pixels ``[start, stop)``, whose spectra are ``spec``, in order."""
        nr, nc = self.grid.band_shape
        if stop <= start or nr == 0 or nc == 0:
            return
        er, ec = (self.er[start:stop], self.ec[start:stop]) if self.phase else (self.er, self.ec)
        trotter_kernel()(
            np.ascontiguousarray(spec, dtype=np.complex128),
            self.vr[start:stop],
            self.vc[start:stop],
            self.m[start:stop],
            self.qr,
            self.qc,
            er,
            ec,
            self.phase,
            self.out.s1,
            self.out.s2,
            self.counts,
            self.out.e1,
            self.out.e2,
        )

    def finish(self) -> PartialSums:
        """The sums, with the counts and the quadratic aberrations' phase factor applied."""
        out = self.out
        out.n1[...] = self.counts[0]
        out.n2[...] = self.counts[1]
        if self.phase and self.vr.size:  # no pixels: the sums stay zeros, as they were
            pf = self.grid.phase_factor(self.ab, self.wavelength_A)
            out.s1 *= pf
            out.s2 *= np.conj(pf)
        return out
