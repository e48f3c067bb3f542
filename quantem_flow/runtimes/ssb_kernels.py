"""The FFT and accumulation stage of single-sideband (SSB) ptychography, per runtime.

This module knows nothing of Dask or datasets: it receives host arrays of
bright-field pixel values (one scan image per detector pixel), transforms
them over the scan on a runtime (``cpu``: NumPy/SciPy, ``cuda``: CuPy,
``mps``: MLX) and returns small host partial sums over the double-overlap
("trotter") regions, from which the operator in
:mod:`quantem_flow.operators.ssb` assembles the object.

The code is written once against a small array adapter (:class:`ArrayOps`);
each runtime supplies an adapter.  Precision is explicit: ``cpu`` and
``cuda`` run in float64/complex128; MLX has no complex128 FFT (``mx.fft``
returns complex64), so the ``mps`` adapter exists only in complex64 and
:func:`resolve_ssb_backend` refuses it unless the caller allows complex64.

Model and conventions (see :func:`quantem_flow.operators.ssb.ssb`)
------------------------------------------------------------------
For a detector pixel at scan-frame angle ``v`` (rad) and a scan frequency
``Q`` at angle ``q = lambda * Q`` (rad), with the top-hat aperture
``A(w) = [|w| < alpha]`` and the aberration phase ``chi``::

    F(Q, v) = M1(Q, v) c(Q) + M2(Q, v) conj(c(-Q))
    M1 = A(v) A(v - q) exp(+i chi(v)) exp(-i chi(v - q))    (trotter T1)
    M2 = A(v) A(v + q) exp(-i chi(v)) exp(+i chi(v + q))    (trotter T2)

where ``F`` is the scan FFT of the pixel's intensity divided by its scan
mean, minus one, over the number of FFT points, and ``c`` the Fourier
coefficients of ``O - 1`` (``O`` the transmission function).  T1 holds the
pixels with ``A(v - q) = 1`` and ``A(v + q) = 0``; T2 the reverse.  Per
half-plane frequency ``Q`` (the real FFT's) the stage accumulates over
pixels::

    S1 = sum_T1 F conj(M1),  N1 = |T1|,  E1 = sum_T1 |F|^2     (and S2, N2, E2)

``S1 / N1`` estimates ``c(Q)`` and ``conj(S2 / N2)`` estimates ``c(-Q)``, so
the two trotters of the half plane give the whole plane.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..errors import ParameterError, RuntimeUnavailableError, UnsupportedOperationError
from . import BackendChoice, available_runtimes, get_runtime
from .registry import auto_order, dtype_name, get_spec, load_attribute, runtime_specs

__all__ = [
    "ELEMENTWISE_ELEMENTS",
    "SPECTRA_SUB_BLOCK",
    "Aberrations",
    "ArrayOps",
    "CupyOps",
    "MlxOps",
    "NumpyOps",
    "PartialSums",
    "QGrid",
    "accumulate",
    "assemble",
    "chi",
    "make_ops",
    "prewarm",
    "resolve_ssb_backend",
    "spectra",
]

#: Pixels the CPU adapter transforms together inside a block (small enough that its
#: buffers stay in cache; the result does not depend on it).
SPECTRA_SUB_BLOCK = 8

#: Largest number of (pixel, frequency) elements one elementwise step holds;
#: the pixels of a block are processed in sub-blocks of at most this many.
ELEMENTWISE_ELEMENTS = 2**22

_MLX_LOCK_FALLBACK = threading.Lock()


# -- aberrations ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Aberrations:
    """Axial aberration coefficients in the polar (Krivanek) notation.

    Attributes
    ----------
    terms
        ``{(n, m): (C_nm in Å, phi_nm in rad)}``; ``m <= n + 1`` and
        ``n + 1 - m`` even.  ``(1, 0)`` is C10 (defocus), ``(1, 2)`` C12
        (two-fold astigmatism), ``(3, 0)`` C30 (spherical aberration).
    """

    terms: Mapping[tuple[int, int], tuple[float, float]]

    @property
    def is_zero(self) -> bool:
        """Whether every coefficient is zero."""
        return all(c == 0.0 for c, _ in self.terms.values())

    @property
    def is_quadratic(self) -> bool:
        """Whether only first-order terms (C10, C12) are non-zero."""
        return all(n == 1 for (n, _), (c, _) in self.terms.items() if c != 0.0)

    def quadratic_form(self) -> tuple[float, float, float]:
        """Return ``(C10, C12 cos 2 phi12, C12 sin 2 phi12)`` in Å."""
        c10 = self.terms.get((1, 0), (0.0, 0.0))[0]
        c12, phi12 = self.terms.get((1, 2), (0.0, 0.0))
        return c10, c12 * math.cos(2 * phi12), c12 * math.sin(2 * phi12)


def chi(w_r: Any, w_c: Any, ab: Aberrations, wavelength_A: float, ops: ArrayOps) -> Any:
    """Return the aberration phase ``chi`` (rad) at scan-frame angles ``(w_r, w_c)`` (rad).

    ``chi(w) = (2 pi / lambda) sum C_nm |w|^(n+1) / (n+1) cos(m (phi - phi_nm))`` with
    ``phi = atan2(w_r, w_c)`` (from the scan column axis toward the row axis).
    """
    theta2 = w_r * w_r + w_c * w_c
    z = None
    total: Any = 0.0
    for (n, m), (c, phi) in sorted(ab.terms.items()):
        if c == 0.0:
            continue
        radial = theta2 ** ((n + 1 - m) // 2) if n + 1 - m else 1.0
        if m == 0:
            angular: Any = 1.0
        else:
            if z is None:
                z = ops.complex_from(w_c, w_r)
            zm = z
            for _ in range(m - 1):
                zm = zm * z
            angular = ops.real(zm * complex(math.cos(m * phi), -math.sin(m * phi)))
        total = total + (2 * math.pi / wavelength_A) * c / (n + 1) * radial * angular
    return total


# -- array adapters ---------------------------------------------------------------------
class ArrayOps:
    """The array operations the SSB stage needs, on one runtime."""

    name: ClassVar[str] = "abstract"
    real_dtype: Any = None
    complex_dtype: Any = None
    precision: ClassVar[str] = ""

    def asarray(self, a: np.ndarray) -> Any:
        """Copy a host array to the device in the real (or complex) working dtype."""
        raise NotImplementedError

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """Real FFT over the last two axes, zero-padded at the end to ``shape``."""
        raise NotImplementedError

    def normalise(self, block: np.ndarray, inv_mean: np.ndarray) -> Any:
        """``block * inv_mean[:, None, None] - 1`` on the device in the real working dtype."""
        x = self.asarray(block)
        scale = self.asarray(np.asarray(inv_mean, dtype=np.float64).reshape(-1, 1, 1))
        return x * scale - 1.0

    def exp_i(self, phase: Any) -> Any:
        """``exp(i * phase)`` of a real array."""
        raise NotImplementedError

    def complex_from(self, re: Any, im: Any) -> Any:
        """``re + i im``."""
        return re + 1j * im

    def real(self, z: Any) -> Any:
        """Real part."""
        raise NotImplementedError

    def abs2(self, z: Any) -> Any:
        """``|z|^2`` as a real array."""
        raise NotImplementedError

    def where(self, mask: Any, a: Any) -> Any:
        """``a`` where ``mask``, else 0."""
        raise NotImplementedError

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        raise NotImplementedError

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """Select ``index`` along ``axis``."""
        raise NotImplementedError

    def to_host(self, x: Any) -> np.ndarray:
        """Copy to a host NumPy array (synchronising)."""
        raise NotImplementedError

    def band_spectra(self, block: np.ndarray, inv_mean: np.ndarray, grid: QGrid) -> Any:
        """A faster :func:`spectra` for this runtime, or ``None`` to use the generic one."""
        return None

    def trotter_sums(
        self,
        spec: Any,
        v_r: np.ndarray,
        v_c: np.ndarray,
        grid: QGrid,
        ab: Aberrations,
        wavelength_A: float,
    ) -> PartialSums | None:
        """A faster :func:`accumulate` for this runtime, or ``None`` to use the generic one."""
        return None

    def lock(self) -> Any:
        """A context manager that serialises device evaluation where needed."""
        return _NullLock()

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for provenance."""
        return {"runtime": self.name, "precision": self.precision}


class _NullLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class NumpyOps(ArrayOps):
    """NumPy arrays, SciPy's pocketfft with ``workers`` threads; float64/complex128."""

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

    def band_spectra(self, block: np.ndarray, inv_mean: np.ndarray, grid: QGrid) -> Any:
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
        out = np.empty((n, nr, nc), dtype=np.complex128)
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
        grid: QGrid,
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
        _trotter_kernel()(
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
            "accumulation": "one compiled (Numba) loop over pixels x band frequencies for no "
            "or quadratic (C10, C12) aberrations, float64/complex128, pixels summed in order; "
            "NumPy arrays for higher orders",
        }


class CupyOps(ArrayOps):
    """CuPy arrays and cuFFT on the current CUDA device; float64/complex128."""

    name: ClassVar[str] = "cuda"
    precision: ClassVar[str] = "float64 data, complex128 FFT (cuFFT Z2Z/D2Z) and sums"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        self.real_dtype = cupy.float64
        self.complex_dtype = cupy.complex128

    def asarray(self, a: np.ndarray) -> Any:
        """Upload, then widen on the device (fewer bytes cross the bus)."""
        d = self.cp.asarray(np.ascontiguousarray(a))
        if np.iscomplexobj(a):
            return d.astype(self.cp.complex128, copy=False)
        return d.astype(self.cp.float64, copy=False)

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """``cupy.fft.rfft2`` (cuFFT)."""
        return self.cp.fft.rfft2(x, s=shape, axes=(-2, -1))

    def exp_i(self, phase: Any) -> Any:
        """``exp(i phase)`` in complex128."""
        return self.cp.exp(1j * phase.astype(self.cp.float64, copy=False))

    def real(self, z: Any) -> Any:
        """Real part."""
        return self.cp.real(z)

    def abs2(self, z: Any) -> Any:
        """``re^2 + im^2``."""
        re, im = self.cp.real(z), self.cp.imag(z)
        return re * re + im * im

    def where(self, mask: Any, a: Any) -> Any:
        """``cupy.where(mask, a, 0)``."""
        return self.cp.where(mask, a, 0)

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        return self.cp.sum(x, axis=0)

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """``cupy.take``."""
        return self.cp.take(x, self.cp.asarray(index), axis=axis)

    def to_host(self, x: Any) -> np.ndarray:
        """``cupy.asnumpy`` (synchronises the stream)."""
        if isinstance(x, (int, float, complex)):
            return np.asarray(x)
        out: np.ndarray = self.cp.asnumpy(x)
        return out

    def describe(self) -> dict[str, Any]:
        """Runtime, device and precision."""
        dev = self.cp.cuda.Device()
        props = self.cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return {
            "runtime": self.name,
            "precision": self.precision,
            "device": f"cuda:{dev.id} ({name})",
            "cupy_version": str(self.cp.__version__),
        }


class MlxOps(ArrayOps):
    """MLX arrays and ``mx.fft``: complex64 only (MLX has no complex128 FFT)."""

    name: ClassVar[str] = "mps"
    precision: ClassVar[str] = (
        "float32 data, complex64 FFT and within-block sums (MLX has no complex128 FFT; "
        "allowed explicitly by allow_complex64=True); across-block sums in complex128 on "
        "the host"
    )

    def __init__(self) -> None:
        import mlx.core as mx

        self.mx = mx
        self.real_dtype = mx.float32
        self.complex_dtype = mx.complex64

    def asarray(self, a: np.ndarray) -> Any:
        """Host array as MLX float32 (complex64 for complex input)."""
        if np.iscomplexobj(a):
            return self.mx.array(np.asarray(a, dtype=np.complex64))
        return self.mx.array(np.asarray(a, dtype=np.float32))

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """``mx.fft.rfft2`` (complex64)."""
        return self.mx.fft.rfft2(x, s=tuple(shape), axes=(-2, -1))

    def exp_i(self, phase: Any) -> Any:
        """``exp(i phase)`` in complex64."""
        return self.mx.exp(1j * phase)

    def real(self, z: Any) -> Any:
        """Real part."""
        return self.mx.real(z)

    def abs2(self, z: Any) -> Any:
        """``re^2 + im^2``."""
        re, im = self.mx.real(z), self.mx.imag(z)
        return re * re + im * im

    def where(self, mask: Any, a: Any) -> Any:
        """``mx.where(mask, a, 0)``."""
        return self.mx.where(mask, a, self.mx.zeros_like(a))

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        return self.mx.sum(x, axis=0)

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """``mx.take``."""
        return self.mx.take(x, self.mx.array(np.asarray(index, dtype=np.int32)), axis=axis)

    def to_host(self, x: Any) -> np.ndarray:
        """Evaluate and copy into NumPy."""
        if isinstance(x, (int, float, complex)):
            return np.asarray(x)
        self.mx.eval(x)
        return np.array(x)

    def lock(self) -> Any:
        """The process-wide MLX evaluation lock of the ``mps`` runtime."""
        try:
            from .mps import _LOCK

            return _LOCK
        except ImportError:  # pragma: no cover - the mps module always imports
            return _MLX_LOCK_FALLBACK

    def describe(self) -> dict[str, Any]:
        """Runtime, MLX version, device and precision."""
        mx = self.mx
        return {
            "runtime": self.name,
            "precision": self.precision,
            "mlx_version": str(getattr(mx, "__version__", "unknown")),
            "device": str(mx.default_device()),
        }


_TROTTER_KERNEL: Any = None
_TROTTER_LOCK = threading.Lock()


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
) -> None:  # pragma: no cover - compiled by Numba (the Python body is the reference)
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


def _trotter_kernel() -> Any:
    """The compiled trotter loop (Numba, no fastmath: IEEE order kept; cached on disk)."""
    global _TROTTER_KERNEL
    with _TROTTER_LOCK:
        if _TROTTER_KERNEL is None:
            import numba

            from .. import config

            _TROTTER_KERNEL = numba.njit(cache=bool(config.get("numba_cache")), nogil=True)(
                _trotter_loop
            )
        return _TROTTER_KERNEL


def prewarm(runtime: str) -> threading.Thread | None:
    """Load the compiled trotter loop in a background thread (``cpu`` only; else ``None``).

    The first Numba dispatch of a process loads Numba's target context and
    the cached machine code (about a second on a 2-core VM); started when the
    SSB plan is made, it overlaps the gather pass (I/O and copies) instead of
    adding to the SSB stage.  The stage's own call then waits for it, if
    needed, on Numba's compiler lock.  Values do not depend on it.
    """
    if runtime != "cpu":
        return None

    def load() -> None:
        f = np.zeros((1, 1, 1), dtype=np.complex128)
        one = np.zeros(1)
        e = np.ones((1, 1), dtype=np.complex128)
        z = np.zeros((1, 1))
        _trotter_kernel()(
            f, one, one, one, one, one, e, e, True, f[0].copy(), f[0].copy(),
            np.zeros((2, 1, 1), dtype=np.int64), z, z.copy(),
        )  # fmt: skip

    thread = threading.Thread(target=load, name="qf-ssb-prewarm", daemon=True)
    thread.start()
    return thread


# -- backend choice ---------------------------------------------------------------------
def _complex128(spec: Any) -> bool:
    return bool(spec.array_ops_precision == "complex128")


def resolve_ssb_backend(
    backend: str, *, allow_complex64: bool = False, dtype: Any = None
) -> BackendChoice:
    """Choose the runtime of the SSB FFT/accumulation stage from the runtime declarations.

    A runtime runs the stage when it declares an array adapter
    (``RuntimeSpec.array_ops``) and the ``("ssb", "gathered", dtype)``
    kernel; one whose adapter is complex64 only (MLX) runs only when the
    caller allows complex64.

    Parameters
    ----------
    backend
        ``"auto"`` or a registered runtime name.
    allow_complex64
        Allow a runtime without complex128 FFT (MLX) to run in complex64.
    dtype
        The dtype of the gathered bright-field values (the dataset's);
        ``None`` accepts any.

    Returns
    -------
    BackendChoice
        Requested and chosen runtime and why.

    Raises
    ------
    RuntimeUnavailableError
        An explicit runtime is unknown or not available here, or no runtime
        is eligible for ``"auto"`` (the message names those that are).
    UnsupportedOperationError
        An explicit runtime has no SSB stage for ``dtype``, or is complex64
        only without ``allow_complex64=True``.
    """
    if not isinstance(backend, str):
        raise ParameterError(f"backend must be a string, got {backend!r}")
    dt = None if dtype is None else dtype_name(dtype)
    specs = runtime_specs()
    if backend == "auto":
        available = available_runtimes()
        order = auto_order()
        skipped: list[str] = []
        for name in order:
            spec = specs[name]
            if spec.array_ops is None or not spec.supports("ssb", "gathered", dt):
                skipped.append(f"{name} (no SSB stage" + (f" for {dt}" if dt else "") + ")")
                continue
            if name not in available:
                skipped.append(f"{name} (not available here)")
                continue
            ok, why = get_runtime(name).auto_eligible()
            if not ok:
                skipped.append(f"{name} ({why})")
                continue
            if not _complex128(spec) and not allow_complex64:
                skipped.append(f"{name} (no complex128 FFT; allow_complex64=False)")
                continue
            reason = f"first of {list(order)} able to run the SSB FFT stage"
            if skipped:
                reason += "; passed over: " + "; ".join(skipped)
            return BackendChoice("auto", name, reason)
        raise RuntimeUnavailableError(
            f"no runtime here can run the SSB FFT stage by backend='auto'; passed over: "
            f"{'; '.join(skipped)}"
        )
    explicit = specs.get(backend)
    if explicit is None:
        able = [n for n, s in specs.items() if s.array_ops is not None]
        raise RuntimeUnavailableError(
            f"unknown runtime {backend!r} for the SSB FFT stage; expected 'auto' or one of {able}"
        )
    if explicit.array_ops is None or not explicit.supports("ssb", "gathered", dt):
        able = [
            n
            for n, s in specs.items()
            if s.array_ops is not None and s.supports("ssb", "gathered", dt)
        ]
        raise UnsupportedOperationError(
            f"runtime {backend!r} has no SSB FFT stage"
            + (f" for {dt} data" if dt else "")
            + f"; runtimes that have one: {able}"
        )
    get_runtime(backend)  # raises RuntimeUnavailableError naming those that are available
    if not _complex128(explicit) and not allow_complex64:
        raise UnsupportedOperationError(
            f"runtime {backend!r} has no complex128 FFT (its SSB adapter computes in "
            f"{explicit.array_ops_precision} only). SSB never lowers precision silently: pass "
            "allow_complex64=True to run the FFT stage in complex64 (recorded in provenance), "
            "or use a complex128 runtime such as backend='cpu' or 'cuda'"
        )
    return BackendChoice(backend, backend, "requested explicitly")


def make_ops(name: str, *, workers: int | None = None) -> ArrayOps:
    """Return the SSB array adapter runtime ``name`` declares (``RuntimeSpec.array_ops``).

    ``workers`` is passed to adapters that take it (the NumPy adapter's FFT threads).
    """
    spec = get_spec(name)
    if spec.array_ops is None:
        raise RuntimeUnavailableError(
            f"runtime {name!r} declares no SSB array adapter; runtimes that do: "
            f"{[n for n, s in runtime_specs().items() if s.array_ops is not None]}"
        )
    cls = load_attribute(spec.array_ops)
    ops = cls(workers) if workers is not None and issubclass(cls, NumpyOps) else cls()
    if not isinstance(ops, ArrayOps):
        raise RuntimeUnavailableError(
            f"the SSB adapter {spec.array_ops} of runtime {name!r} is not an ArrayOps"
        )
    return ops


# -- the stage --------------------------------------------------------------------------
@dataclasses.dataclass
class QGrid:
    """Scan frequencies of the (padded) FFT, band-limited to where trotters exist.

    Attributes
    ----------
    fft_shape
        ``(R_fft, C_fft)`` FFT size over the scan (the scan shape, or ``pad_to``).
    rows
        Row indices (FFT order) with ``|q_r| < 2 alpha``.
    cols
        Real-FFT column indices (``0 .. C_fft // 2``) with ``q_c < 2 alpha``.
    q_r, q_c
        Angles ``lambda * Q`` (rad) of those rows and columns.
    alpha_rad
        Aperture semiangle (rad).
    """

    fft_shape: tuple[int, int]
    rows: np.ndarray
    cols: np.ndarray
    q_r: np.ndarray
    q_c: np.ndarray
    alpha_rad: float

    @classmethod
    def build(
        cls,
        fft_shape: tuple[int, int],
        scan_step_A: tuple[float, float],
        wavelength_A: float,
        alpha_rad: float,
    ) -> QGrid:
        """Frequencies of an FFT of ``fft_shape`` with steps ``scan_step_A``."""
        Rp, Cp = fft_shape
        fr = np.fft.fftfreq(Rp, d=scan_step_A[0]) * wavelength_A
        fc = np.fft.rfftfreq(Cp, d=scan_step_A[1]) * wavelength_A
        rows = np.flatnonzero(np.abs(fr) < 2 * alpha_rad)
        cols = np.flatnonzero(np.abs(fc) < 2 * alpha_rad)
        return cls(
            fft_shape=(int(Rp), int(Cp)),
            rows=rows,
            cols=cols,
            q_r=fr[rows],
            q_c=fc[cols],
            alpha_rad=float(alpha_rad),
        )

    @property
    def half_shape(self) -> tuple[int, int]:
        """Shape of the real-FFT half plane."""
        return self.fft_shape[0], self.fft_shape[1] // 2 + 1

    @property
    def band_shape(self) -> tuple[int, int]:
        """Shape of the band-limited part of the half plane."""
        return int(self.rows.size), int(self.cols.size)

    def phase_factor(self, ab: Aberrations, wavelength_A: float) -> np.ndarray:
        """``exp(i chi(q))`` on the band (host, complex128), for quadratic aberrations."""
        qr = np.broadcast_to(self.q_r[:, None], self.band_shape)
        qc = np.broadcast_to(self.q_c[None, :], self.band_shape)
        ch = chi(qr, qc, ab, wavelength_A, NumpyOps(1))
        return np.asarray(np.exp(1j * np.asarray(ch, dtype=np.float64)))


@dataclasses.dataclass
class PartialSums:
    """Per-frequency sums over the trotters on the band (host, float64/complex128)."""

    s1: np.ndarray
    s2: np.ndarray
    n1: np.ndarray
    n2: np.ndarray
    e1: np.ndarray
    e2: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, int]) -> PartialSums:
        """Empty sums on a band of ``shape``."""
        return cls(
            s1=np.zeros(shape, np.complex128),
            s2=np.zeros(shape, np.complex128),
            n1=np.zeros(shape),
            n2=np.zeros(shape),
            e1=np.zeros(shape),
            e2=np.zeros(shape),
        )

    def add(self, other: PartialSums) -> None:
        """Add ``other`` in place (complex128/float64)."""
        self.s1 += other.s1
        self.s2 += other.s2
        self.n1 += other.n1
        self.n2 += other.n2
        self.e1 += other.e1
        self.e2 += other.e2


def spectra(ops: ArrayOps, block: np.ndarray, inv_mean: np.ndarray, grid: QGrid) -> Any:
    """Return the band-limited normalised scan spectra of a block of pixels (device).

    Parameters
    ----------
    ops
        The runtime's adapter.
    block
        ``(n, R_r, R_c)`` pixel values (any real dtype), host.
    inv_mean
        ``(n,)`` 1 / (mean over the scan) of each pixel, host float64.
    grid
        The frequency grid.

    Returns
    -------
    Any
        ``(n, rows, cols)`` complex device array ``rfft2(I / mean - 1) / N_fft``.
    """
    fast = ops.band_spectra(block, inv_mean, grid)
    if fast is not None:
        return fast
    x = ops.normalise(block, inv_mean)
    f = ops.rfft2(x, grid.fft_shape)
    del x
    f = ops.take(ops.take(f, grid.rows, 1), grid.cols, 2)
    return f * (1.0 / (grid.fft_shape[0] * grid.fft_shape[1]))


def accumulate(
    ops: ArrayOps,
    spec: Any,
    v_r: np.ndarray,
    v_c: np.ndarray,
    grid: QGrid,
    ab: Aberrations,
    wavelength_A: float,
) -> PartialSums:
    """Sum the trotters of a block of pixel spectra (see the module docstring).

    Parameters
    ----------
    ops
        The runtime's adapter.
    spec
        ``(n, rows, cols)`` device spectra from :func:`spectra`.
    v_r, v_c
        ``(n,)`` scan-frame angles (rad) of the pixels; all inside the aperture.
    grid
        The frequency grid.
    ab
        Aberrations.  When only C10 and C12 are non-zero the per-frequency
        factor ``exp(i chi(q))`` is left out and the returned ``s1`` / ``s2``
        must be multiplied by ``P = exp(i chi(q))`` / ``conj(P)``
        (:meth:`QGrid.phase_factor`); :func:`accumulate_block` does this.
    wavelength_A
        Electron wavelength (Å).

    Returns
    -------
    PartialSums
        Host sums on the band.
    """
    fast = ops.trotter_sums(spec, v_r, v_c, grid, ab, wavelength_A)
    if fast is not None:
        return fast
    n = int(v_r.size)
    nr, nc = grid.band_shape
    out = PartialSums.zeros((nr, nc))
    if n == 0 or nr == 0 or nc == 0:
        return out
    step = max(1, ELEMENTWISE_ELEMENTS // max(nr * nc, 1))
    qr = ops.asarray(grid.q_r.reshape(1, nr, 1))
    qc = ops.asarray(grid.q_c.reshape(1, 1, nc))
    q2 = qr * qr + qc * qc
    a2 = grid.alpha_rad**2
    quadratic = ab.is_quadratic
    c10, c12a, c12b = ab.quadratic_form()
    k = -2.0 * math.pi / wavelength_A  # exp(-2 i B), B = (pi / lambda) u . q
    for s in range(0, n, step):
        e = min(n, s + step)
        vr_h, vc_h = v_r[s:e], v_c[s:e]
        vr = ops.asarray(vr_h.reshape(-1, 1, 1))
        vc = ops.asarray(vc_h.reshape(-1, 1, 1))
        m = ops.asarray((a2 - vr_h * vr_h - vc_h * vc_h).reshape(-1, 1, 1))
        f = spec[s:e]
        two_dot = 2.0 * (vr * qr + vc * qc)
        in_minus = (q2 - two_dot) < m
        in_plus = (q2 + two_dot) < m
        t1 = in_minus & ~in_plus
        t2 = in_plus & ~in_minus
        if ab.is_zero:
            x1 = x2 = f
        elif quadratic:
            u_r = c10 * vr_h + c12a * (-vr_h) + c12b * vc_h
            u_c = c10 * vc_h + c12a * vc_h + c12b * vr_h
            er = ops.exp_i(ops.asarray((k * u_r[:, None] * grid.q_r[None, :])[:, :, None]))
            ec = ops.exp_i(ops.asarray((k * u_c[:, None] * grid.q_c[None, :])[:, None, :]))
            x1 = x2 = f * (er * ec)
        else:
            chi_v = chi(vr, vc, ab, wavelength_A, ops)
            d1 = chi(vr - qr, vc - qc, ab, wavelength_A, ops) - chi_v
            d2 = chi(vr + qr, vc + qc, ab, wavelength_A, ops) - chi_v
            x1 = f * ops.exp_i(d1)
            x2 = f * ops.exp_i(-1.0 * d2)
        p = ops.abs2(f)
        one = ops.asarray(np.ones((1, 1, 1)))
        parts = (
            ops.sum0(ops.where(t1, x1)),
            ops.sum0(ops.where(t2, x2)),
            ops.sum0(ops.where(t1, one)),
            ops.sum0(ops.where(t2, one)),
            ops.sum0(ops.where(t1, p)),
            ops.sum0(ops.where(t2, p)),
        )
        host = [np.asarray(ops.to_host(x)) for x in parts]
        out.add(
            PartialSums(
                s1=host[0].astype(np.complex128),
                s2=host[1].astype(np.complex128),
                n1=np.rint(host[2].astype(np.float64)),
                n2=np.rint(host[3].astype(np.float64)),
                e1=host[4].astype(np.float64),
                e2=host[5].astype(np.float64),
            )
        )
    if quadratic and not ab.is_zero:
        pf = grid.phase_factor(ab, wavelength_A)
        out.s1 *= pf
        out.s2 *= np.conj(pf)
    return out


def assemble(sums: PartialSums, grid: QGrid) -> tuple[np.ndarray, dict[str, float]]:
    """Combine both trotters into ``c(Q)`` on the whole FFT plane, and the loss.

    Parameters
    ----------
    sums
        Trotter sums on the band.
    grid
        The frequency grid.

    Returns
    -------
    tuple
        ``c`` (``fft_shape`` complex128, FFT order, ``c[0, 0] = 0``) and a
        record with ``loss`` (the double-overlap residual ``sum |F - model|^2 /
        sum |F|^2`` over both trotters), ``residual``, ``energy`` and the
        number of frequencies with an estimate.
    """
    Rp, Cp = grid.fft_shape
    _, Cf = grid.half_shape
    half = (Rp, Cf)

    def full(a: np.ndarray, dtype: Any) -> np.ndarray:
        z = np.zeros(half, dtype=dtype)
        z[np.ix_(grid.rows, grid.cols)] = a
        return z

    s1, s2 = full(sums.s1, np.complex128), full(sums.s2, np.complex128)
    n1, n2 = full(sums.n1, np.float64), full(sums.n2, np.float64)
    e1, e2 = full(sums.e1, np.float64), full(sums.e2, np.float64)
    neg_r = (-np.arange(Rp)) % Rp
    neg_c = (-np.arange(Cf)) % Cp
    s = np.zeros((Rp, Cp), np.complex128)
    nn = np.zeros((Rp, Cp))
    s[:, :Cf] += s1
    nn[:, :Cf] += n1
    idx = (neg_r[:, None], neg_c[None, :])
    np.add.at(s, idx, np.conj(s2))
    np.add.at(nn, idx, n2)
    c = np.zeros((Rp, Cp), np.complex128)
    ok = nn > 0
    c[ok] = s[ok] / nn[ok]
    c[0, 0] = 0.0
    c_h = c[:, :Cf]
    c_m = c[idx]
    r1 = e1 - 2 * np.real(np.conj(c_h) * s1) + n1 * np.abs(c_h) ** 2
    r2 = e2 - 2 * np.real(c_m * s2) + n2 * np.abs(c_m) ** 2
    w = np.ones(Cf)
    w[0] = 0.5
    if Cp % 2 == 0 and Cf > 1:
        w[-1] = 0.5
    residual = float(np.sum(w * (r1 + r2)))
    energy = float(np.sum(w * (e1 + e2)))
    loss = residual / energy if energy > 0 else math.nan
    return c, {
        "loss": loss,
        "residual": residual,
        "energy": energy,
        "frequencies_estimated": int(np.count_nonzero(ok)),
        "frequencies_total": int(Rp * Cp),
    }
