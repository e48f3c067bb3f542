"""Synthetic 4D-STEM data from wave optics: a weak phase object under a coherent probe.

The ``"wave"`` model of :mod:`quantem_flow.synthetic`, physically consistent
for ptychography (SSB) as well as for virtual detectors and DPC:

* the specimen is a weak phase object ``O(r) = exp(i phi(r))`` on a periodic
  grid: Gaussian "atoms" (heavy at the cell corners, light at the cell
  centres, a few vacancies) on a square lattice that tiles the field of view,
  scaled to ``phase_max_rad``;
* the probe is ``IFT[A(k) exp(-i chi(k))]`` with a sharp aperture of
  ``semiangle_mrad`` and defocus ``chi = pi lambda C10 |k|^2``;
* each frame is ``|FFT(probe(r - R) O(r))|^2`` (projection approximation),
  cropped to the detector around the direct beam, placed **off-centre**, so
  that centre finding is exercised, normalised to one electron, and drawn
  with Poisson noise of ``dose_per_frame`` electrons.

The diffraction grid sets the calibration: a detector pixel of
``detector_mrad`` is ``dk = detector_mrad / lambda`` in reciprocal space,
the object grid step is ``dx = 1 / (N dk)`` for an ``N x N`` grid, and the
scan steps are whole grid steps chosen so that the scan tiles the periodic
grid (``N`` a common multiple of the scan's rows and columns).  The data are
calibrated (scan in Å, detector in mrad, the voltage), and the truth holds
the phase at the scan positions band-limited to the SSB band ``|q| < 2
alpha / lambda``, which is what a perfect SSB reconstruction returns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .calibration import Calibration, electron_wavelength_angstrom
from .errors import DtypeError, ParameterError

__all__ = ["WaveFrames", "WaveTruth", "wave_truth"]

#: Lattice cells across the (square) field of view.
_CELLS = 4
#: Gaussian width of an atom's phase, in Å.
_ATOM_SIGMA_A = 0.28
#: Largest object grid (memory of one row of frames: C x N x N complex128).
_MAX_GRID = 1024


@dataclasses.dataclass(frozen=True)
class WaveTruth:
    """The known answer of a ``"wave"`` synthetic dataset.

    Attributes
    ----------
    phase
        ``(R_r, R_c)`` specimen phase at the scan positions in rad,
        band-limited to the SSB band (what SSB can recover).
    phase_full
        ``(N, N)`` phase on the object grid, in rad.
    scan_shape, detector_shape
        ``(R_r, R_c)`` and ``(k_r, k_c)``.
    voltage_kV, semiangle_mrad, defocus_A
        The microscope: beam energy, probe aperture, defocus (C10, Å).
    detector_mrad
        Detector pixel size (mrad, both axes).
    scan_step_A
        Scan step (row, col) in Å.
    beam_center
        ``(row, col)`` detector pixel of the undeflected beam (the optical axis).
    grid, grid_steps
        Object grid size ``N`` and the scan step in grid pixels (row, col).
    dose_per_frame, seed, dtype
        Expected electrons per frame, noise seed, stored dtype.
    """

    phase: np.ndarray
    phase_full: np.ndarray
    scan_shape: tuple[int, int]
    detector_shape: tuple[int, int]
    voltage_kV: float
    semiangle_mrad: float
    defocus_A: float
    detector_mrad: float
    scan_step_A: tuple[float, float]
    beam_center: tuple[int, int]
    grid: int
    grid_steps: tuple[int, int]
    dose_per_frame: float
    seed: int
    dtype: str
    phase_max_rad: float

    model = "wave"

    @property
    def probe_center(self) -> tuple[float, float]:
        """The undeflected beam's detector pixel (as the disk model names it)."""
        return (float(self.beam_center[0]), float(self.beam_center[1]))

    @property
    def probe_radius(self) -> float:
        """The bright-field disk's radius in detector pixels."""
        return self.semiangle_mrad / self.detector_mrad

    def calibration(self) -> Calibration:
        """The calibration the data carry (scan Å, detector mrad from the beam, voltage)."""
        return Calibration(
            scan_sampling=self.scan_step_A,
            scan_units="Å",
            detector_sampling=(self.detector_mrad, self.detector_mrad),
            detector_units="mrad",
            detector_origin=self.probe_center,
            accelerating_voltage_kV=self.voltage_kV,
        )

    def parameters(self) -> dict[str, Any]:
        """The generating parameters and the calibration, JSON-ready (stored with the data)."""
        return {
            "generator": "quantem_flow.synthetic (model 'wave')",
            "model": "wave",
            "scan_shape": list(self.scan_shape),
            "detector_shape": list(self.detector_shape),
            "voltage_kV": self.voltage_kV,
            "semiangle_mrad": self.semiangle_mrad,
            "defocus_A": self.defocus_A,
            "detector_mrad": self.detector_mrad,
            "scan_step_A": list(self.scan_step_A),
            "beam_center": list(self.beam_center),
            "grid": self.grid,
            "grid_steps": list(self.grid_steps),
            "dose_per_frame": self.dose_per_frame,
            "phase_max_rad": self.phase_max_rad,
            "seed": self.seed,
            "dtype": self.dtype,
            "calibration": self.calibration().to_dict(),
        }


def _grid_for(scan: tuple[int, int], detector: tuple[int, int]) -> tuple[int, tuple[int, int]]:
    """The smallest grid ``N`` that both scan axes tile and that holds the detector."""
    lcm = math.lcm(scan[0], scan[1])
    n = lcm
    while n < max(detector) + 8:
        n += lcm
    if n > _MAX_GRID:
        raise ParameterError(
            f"a scan of {scan} needs an object grid of {n} pixels (a common multiple of its rows "
            f"and columns that holds the {detector} detector), more than {_MAX_GRID}; choose "
            "scan sizes with a larger common divisor (for example equal rows and columns)"
        )
    return n, (n // scan[0], n // scan[1])


def _specimen(n: int, dx: float, seed: int, phase_max: float) -> np.ndarray:
    """A periodic lattice of Gaussian atoms on the ``n x n`` grid, scaled to ``phase_max``."""
    rng = np.random.default_rng([seed, 9876])
    comb = np.zeros((n, n))
    cell = n / _CELLS
    vacancies = {tuple(int(v) for v in rng.integers(0, _CELLS, 2)) for _ in range(2)}
    for i in range(_CELLS):
        for j in range(_CELLS):
            if (i, j) not in vacancies:
                comb[round(i * cell) % n, round(j * cell) % n] += 1.0
            comb[round((i + 0.5) * cell) % n, round((j + 0.5) * cell) % n] += 0.45
    k = np.fft.fftfreq(n, d=dx)
    kr, kc = np.meshgrid(k, k, indexing="ij")
    blur = np.exp(-2 * math.pi**2 * _ATOM_SIGMA_A**2 * (kr**2 + kc**2))
    phase = np.fft.ifft2(np.fft.fft2(comb) * blur).real
    phase -= phase.min()
    return np.asarray(phase * (phase_max / phase.max()))


def wave_truth(
    *,
    scan_shape: Sequence[int] = (48, 64),
    detector_shape: Sequence[int] = (64, 72),
    voltage_kV: float = 300.0,
    semiangle_mrad: float = 20.0,
    detector_mrad: float = 2.0,
    defocus_A: float = 0.0,
    dose_per_frame: float = 5e4,
    phase_max_rad: float = 0.25,
    seed: int = 0,
    dtype: str = "uint16",
) -> WaveTruth:
    """The known answer of a ``"wave"`` dataset (see the module docstring); reads nothing.

    Parameters
    ----------
    scan_shape, detector_shape
        ``(R_r, R_c)`` and ``(k_r, k_c)``.
    voltage_kV, semiangle_mrad, detector_mrad, defocus_A
        Beam energy, probe aperture semiangle, detector pixel size and defocus.
    dose_per_frame
        Expected electrons per frame (Poisson).
    phase_max_rad
        The specimen's largest phase (a weak phase object: well below 1 rad).
    seed, dtype
        Noise and vacancy seed; stored dtype.

    Returns
    -------
    WaveTruth
        Calibration, phase at the scan positions and the generating parameters.
    """
    scan = (int(scan_shape[0]), int(scan_shape[1]))
    det = (int(detector_shape[0]), int(detector_shape[1]))
    if min(scan) < 2 or min(det) < 8:
        raise ParameterError(f"scan {scan} and detector {det} are too small for the wave model")
    for name, value in (
        ("voltage_kV", voltage_kV),
        ("semiangle_mrad", semiangle_mrad),
        ("detector_mrad", detector_mrad),
        ("dose_per_frame", dose_per_frame),
        ("phase_max_rad", phase_max_rad),
    ):
        if not (math.isfinite(float(value)) and float(value) > 0):
            raise ParameterError(f"{name} must be finite and > 0, got {value!r}")
    radius_px = semiangle_mrad / detector_mrad
    if 2 * radius_px + 4 > min(det):
        raise ParameterError(
            f"the bright-field disk ({radius_px:.3g} px radius: semiangle_mrad / detector_mrad) "
            f"does not fit the {det} detector; use larger detector pixels (detector_mrad) or a "
            "larger detector"
        )
    if np.dtype(dtype).kind not in "uif":
        raise DtypeError(f"dtype must be integer or float, got {dtype!r}")
    lam = electron_wavelength_angstrom(float(voltage_kV))
    n, steps = _grid_for(scan, det)
    dk = detector_mrad * 1e-3 / lam  # 1/Å per detector pixel = per grid frequency
    dx = 1.0 / (n * dk)
    phase_full = _specimen(n, dx, seed, phase_max_rad)
    sampled = phase_full[:: steps[0], :: steps[1]]
    step_a = (steps[0] * dx, steps[1] * dx)
    qr = np.fft.fftfreq(scan[0], d=step_a[0])[:, None]
    qc = np.fft.fftfreq(scan[1], d=step_a[1])[None, :]
    band = np.hypot(qr, qc) < 2 * semiangle_mrad * 1e-3 / lam
    phase = np.fft.ifft2(np.fft.fft2(sampled) * band).real
    center = (det[0] // 2 - 3, det[1] // 2 + 4)  # off the detector's middle
    return WaveTruth(
        phase=np.asarray(phase),
        phase_full=phase_full,
        scan_shape=scan,
        detector_shape=det,
        voltage_kV=float(voltage_kV),
        semiangle_mrad=float(semiangle_mrad),
        defocus_A=float(defocus_A),
        detector_mrad=float(detector_mrad),
        scan_step_A=step_a,
        beam_center=center,
        grid=n,
        grid_steps=steps,
        dose_per_frame=float(dose_per_frame),
        seed=int(seed),
        dtype=str(np.dtype(dtype)),
        phase_max_rad=float(phase_max_rad),
    )


class WaveFrames:
    """Generates the scan rows of a ``"wave"`` dataset, one row at a time."""

    def __init__(self, truth: WaveTruth):
        self.truth = truth
        n = truth.grid
        lam = electron_wavelength_angstrom(truth.voltage_kV)
        dk = truth.detector_mrad * 1e-3 / lam
        k = np.fft.fftfreq(n, d=1.0 / (n * dk))
        kr, kc = np.meshgrid(k, k, indexing="ij")
        k2 = kr**2 + kc**2
        aperture = (k2 < (truth.semiangle_mrad * 1e-3 / lam) ** 2).astype(np.float64)
        chi = math.pi * lam * truth.defocus_A * k2
        self.probe = np.fft.ifft2(aperture * np.exp(-1j * chi))
        self.obj = np.exp(1j * truth.phase_full)
        self.dtype = np.dtype(truth.dtype)
        self.max_value = int(np.iinfo(self.dtype).max) if self.dtype.kind in "ui" else float("inf")
        # crop window: the zero frequency (index n // 2 after fftshift) lands on the beam centre
        self.r0 = n // 2 - truth.beam_center[0]
        self.c0 = n // 2 - truth.beam_center[1]
        # one electron per frame over the whole diffraction plane
        self.norm = float(n * n * (np.abs(self.probe) ** 2).sum())

    def intensities(self, r: int) -> np.ndarray:
        """Noise-free frames of scan row ``r``, ``(R_c, k_r, k_c)``, in electrons per frame."""
        t = self.truth
        kr, kc = t.detector_shape
        shifted_row = np.roll(self.probe, t.grid_steps[0] * r, axis=0)
        out = np.empty((t.scan_shape[1], kr, kc))
        for j in range(t.scan_shape[1]):
            psi = np.roll(shifted_row, t.grid_steps[1] * j, axis=1) * self.obj
            wave = np.fft.fftshift(np.fft.fft2(psi))
            out[j] = (np.abs(wave[self.r0 : self.r0 + kr, self.c0 : self.c0 + kc]) ** 2) / self.norm
        return out

    def row(self, r: int) -> np.ndarray:
        """Scan row ``r`` as ``(R_c, k_r, k_c)`` counts (Poisson, seeded per row)."""
        t = self.truth
        rng = np.random.default_rng([t.seed, int(r)])
        lam = self.intensities(r) * t.dose_per_frame
        if self.dtype.kind == "f":
            return np.asarray(rng.poisson(lam), dtype=self.dtype)
        counts = rng.poisson(lam)
        top = int(counts.max())
        if top > self.max_value:
            raise DtypeError(
                f"scan row {r} has a pixel of {top} counts, more than dtype {self.dtype} holds "
                f"({self.max_value}); nothing is clipped -- use a wider dtype or a lower "
                "dose_per_frame"
            )
        return counts.astype(self.dtype)

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Scan rows ``[r0, r1)``."""
        return np.stack([self.row(r) for r in range(r0, r1)])
