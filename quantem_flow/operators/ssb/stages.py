"""The physics of the SSB FFT and accumulation stage, written once against an array adapter.

This module knows nothing of Dask or datasets: it receives host arrays of
bright-field pixel values (one scan image per detector pixel), transforms
them over the scan on a runtime (``cpu``: NumPy/SciPy, ``cuda``: CuPy,
``mps``: MLX) and returns small host partial sums over the double-overlap
("trotter") regions, from which the operator in
:mod:`quantem_flow.operators.ssb.operator` assembles the object.

The code is written once against a small array adapter
(:class:`~quantem_flow.runtimes.array_ops.ArrayOps`); each runtime supplies
one.  Precision is explicit: ``cpu`` and
``cuda`` run in float64/complex128; MLX has no complex128 FFT (``mx.fft``
returns complex64), so the ``mps`` adapter exists only in complex64 and
:func:`~quantem_flow.runtimes.array_ops.resolve_ssb_backend` refuses it unless
the caller allows complex64.

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
from typing import Any

import numpy as np

from ...runtimes.array_ops import Aberrations, ArrayOps, PartialSums

__all__ = [
    "ELEMENTWISE_ELEMENTS",
    "QGrid",
    "accumulate",
    "assemble",
    "block_sums",
    "chi",
    "spectra",
]

#: Largest number of (pixel, frequency) elements one elementwise step holds;
#: the pixels of a block are processed in sub-blocks of at most this many.
ELEMENTWISE_ELEMENTS = 2**22


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
        from ...runtimes.cpu.array_ops import NumpyOps  # its package loads Numba: on use

        ch = chi(qr, qc, ab, wavelength_A, NumpyOps(1))
        return np.asarray(np.exp(1j * np.asarray(ch, dtype=np.float64)))


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


def block_sums(
    ops: ArrayOps,
    block: np.ndarray,
    inv_mean: np.ndarray,
    v_r: np.ndarray,
    v_c: np.ndarray,
    grid: QGrid,
    ab: Aberrations,
    wavelength_A: float,
) -> PartialSums:
    """:func:`spectra` then :func:`accumulate` of a block of pixels, in one step where offered.

    An adapter that takes the spectra a few pixels at a time straight into
    the sums (:meth:`~quantem_flow.runtimes.array_ops.ArrayOps.band_trotter_sums`)
    never holds the block's spectra; its values are those of the two steps.

    Parameters
    ----------
    ops
        The runtime's adapter.
    block, inv_mean
        As for :func:`spectra`.
    v_r, v_c, grid, ab, wavelength_A
        As for :func:`accumulate`.

    Returns
    -------
    PartialSums
        Host sums on the band.
    """
    fused = ops.band_trotter_sums(block, inv_mean, v_r, v_c, grid, ab, wavelength_A)
    if fused is not None:
        return fused
    spec = spectra(ops, block, inv_mean, grid)
    return accumulate(ops, spec, v_r, v_c, grid, ab, wavelength_A)


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
