"""The CPU runtime's SSB array adapter: NumPy/SciPy FFTs and a compiled trotter loop.

The contract is :class:`~quantem_flow.runtimes.array_ops.ArrayOps`; the
stage that uses it is :mod:`quantem_flow.operators.ssb.stages`.
"""

from __future__ import annotations

import math
import threading
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
        """``scipy.fft.rfft2`` with ``workers`` threads."""
        import scipy.fft

        return scipy.fft.rfft2(x, s=shape, axes=(-2, -1), workers=self.workers)

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
        import scipy.fft

        Rp, Cp = grid.fft_shape
        scale = 1.0 / (Rp * Cp)
        n, R, C = (int(v) for v in block.shape)
        rows = np.asarray(grid.rows)
        cols = np.asarray(grid.cols)
        nr, nc = int(rows.size), int(cols.size)
        out = fresh_zeros((n, nr, nc), np.complex128)  # huge pages: fewer first-touch faults
        if n == 0 or nr == 0 or nc == 0:
            return out
        padded = (Rp, Cp) != (R, C)
        prefix = np.array_equal(cols, np.arange(nc))
        # the band's rows in FFT order: non-negative frequencies, then negative ones
        low = int(np.count_nonzero(rows < (Rp + 1) // 2))
        split = np.array_equal(rows[:low], np.arange(low)) and np.array_equal(
            rows[low:], np.arange(Rp - (nr - low), Rp)
        )
        inv = np.asarray(inv_mean, dtype=np.float64) * scale
        sub = max(1, min(SPECTRA_SUB_BLOCK, n))
        x = np.empty((sub, R, C), dtype=np.float64)
        for s in range(0, n, sub):
            e = min(n, s + sub)
            xs = x[: e - s]
            np.multiply(block[s:e], inv[s:e].reshape(-1, 1, 1), out=xs)
            if padded:
                xs -= scale
            f = scipy.fft.rfft(xs, n=Cp, axis=-1, workers=self.workers)
            f = f[:, :, :nc] if prefix else np.take(f, cols, axis=2)
            f = scipy.fft.fft(f, n=Rp, axis=1, workers=self.workers, overwrite_x=True)
            if split:
                out[s:e, :low] = f[:, :low]
                out[s:e, low:] = f[:, Rp - (nr - low) :]
            else:
                out[s:e] = np.take(f, rows, axis=1)
        if not padded and rows[0] == 0 and cols[0] == 0:
            out[:, 0, 0] -= 1.0
        return out

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
        if not (ab.is_zero or ab.is_quadratic):
            return None
        n = int(v_r.size)
        nr, nc = grid.band_shape
        out = PartialSums.zeros((nr, nc))
        if n == 0 or nr == 0 or nc == 0:
            return out
        vr = np.ascontiguousarray(v_r, dtype=np.float64)
        vc = np.ascontiguousarray(v_c, dtype=np.float64)
        m = grid.alpha_rad**2 - vr * vr - vc * vc
        phase = not ab.is_zero
        if phase:
            c10, c12a, c12b = ab.quadratic_form()
            k = -2.0 * math.pi / wavelength_A
            u_r = c10 * vr + c12a * (-vr) + c12b * vc
            u_c = c10 * vc + c12a * vc + c12b * vr
            er = self.exp_i(k * u_r[:, None] * grid.q_r[None, :])
            ec = self.exp_i(k * u_c[:, None] * grid.q_c[None, :])
        else:
            er = np.ones((1, 1), dtype=np.complex128)
            ec = np.ones((1, 1), dtype=np.complex128)
        counts = np.zeros((2, nr, nc), dtype=np.int64)
        trotter_kernel()(
            np.ascontiguousarray(spec, dtype=np.complex128),
            vr,
            vc,
            m,
            np.ascontiguousarray(grid.q_r, dtype=np.float64),
            np.ascontiguousarray(grid.q_c, dtype=np.float64),
            er,
            ec,
            phase,
            out.s1,
            out.s2,
            counts,
            out.e1,
            out.e2,
        )
        out.n1[...] = counts[0]
        out.n2[...] = counts[1]
        if phase:
            pf = grid.phase_factor(ab, wavelength_A)
            out.s1 *= pf
            out.s2 *= np.conj(pf)
        return out

    def describe(self) -> dict[str, Any]:
        """Runtime, precision and FFT library."""
        import scipy

        return {
            "runtime": self.name,
            "precision": self.precision,
            "fft": f"scipy.fft (pocketfft) {scipy.__version__}, workers={self.workers}",
            "spectra": "rfft over scan columns, then fft over scan rows of the band's columns "
            "only (pruned rfft2), float64/complex128",
            "accumulation": "one compiled loop (LLVM IR, no fast-math) over pixels x band "
            "frequencies for no "
            "or quadratic (C10, C12) aberrations, float64/complex128, pixels summed in order; "
            "NumPy arrays for higher orders",
        }

    @classmethod
    def prewarm(cls) -> threading.Thread | None:
        """Import SciPy's FFT and compile the trotter loop in a background thread.

        Started when the SSB plan is made, the import (0.14 s in a fresh
        interpreter) and the compile (:mod:`.trotter_ir`, about 0.02 s)
        overlap the gather pass instead of adding to the SSB stage, whose own
        calls wait for them on the import lock and the kernel's lock.  Values
        do not depend on it.
        """

        def load() -> None:
            import scipy.fft  # noqa: F401  (0.14 s in a fresh interpreter; the stage needs it)

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
