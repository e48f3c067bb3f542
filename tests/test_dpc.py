"""DPC rotation by curl minimisation and iDPC Fourier integration."""

from __future__ import annotations

import math

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.operators.dpc import (
    curl_minimizing_rotation,
    fourier_integrate,
    rotate_field,
)


def periodic_phase(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Gaussian 'atoms' on a periodic grid (positive peaks, positive skew)."""
    R, C = shape
    r, c = np.meshgrid(np.arange(R), np.arange(C), indexing="ij")
    phase = np.zeros(shape)
    for _ in range(12):
        r0, c0 = rng.uniform(0, R), rng.uniform(0, C)
        dr = (r - r0 + R / 2) % R - R / 2
        dc = (c - c0 + C / 2) % C - C / 2
        phase += np.exp(-(dr**2 + dc**2) / (2 * 1.6**2))
    return phase


def spectral_gradient(phase: np.ndarray) -> np.ndarray:
    R, C = phase.shape
    qr = np.fft.fftfreq(R)[:, None]
    qc = np.fft.fftfreq(C)[None, :]
    f = np.fft.fft2(phase)
    return np.stack(
        [np.fft.ifft2(2j * np.pi * qr * f).real, np.fft.ifft2(2j * np.pi * qc * f).real]
    )


def test_fourier_integration_inverts_the_gradient(rng: np.random.Generator) -> None:
    # odd sizes: a real field has no information at an even size's Nyquist frequency
    phase = periodic_phase((41, 57), rng)
    rec = fourier_integrate(spectral_gradient(phase), (1.0, 1.0))
    np.testing.assert_allclose(rec, phase - phase.mean(), atol=1e-9)


@pytest.mark.parametrize("transpose", [False, True])
def test_curl_minimisation_recovers_rotation_and_transpose(
    rng: np.random.Generator, transpose: bool
) -> None:
    phase = periodic_phase((48, 40), rng)
    grad = spectral_gradient(phase)
    theta = float(rng.uniform(0, 2 * math.pi))
    # detector field = inverse of (transpose, then rotate by theta)
    c, s = math.cos(-theta), math.sin(-theta)
    det = np.stack([c * grad[0] - s * grad[1], s * grad[0] + c * grad[1]])
    if transpose:
        det = det[::-1]
    found = curl_minimizing_rotation(det)
    assert found["transpose"] is transpose
    diff = (found["theta_rad"] - theta) % math.pi
    assert min(diff, math.pi - diff) < math.radians(0.5)
    back = rotate_field(det, theta, transpose=transpose)
    np.testing.assert_allclose(back, grad, atol=1e-9)


def test_idpc_resolves_the_180_degree_ambiguity_and_records_it(rng: np.random.Generator) -> None:
    phase = periodic_phase((36, 44), rng)
    grad = spectral_gradient(phase)
    theta = math.radians(float(rng.uniform(0, 360)))
    c, s = math.cos(-theta), math.sin(-theta)
    det = np.stack([c * grad[0] - s * grad[1], s * grad[0] + c * grad[1]])
    com = qf.VectorField(
        data=det + 0.37,  # a constant offset that subtract='mean' removes
        units="px",
        axes=(qf.Axis("component", 2, 1.0, "row,col"), *qf.Calibration().scan_axes(phase.shape)),
        provenance=qf.Provenance(operator="center_of_mass"),
    )
    from quantem_flow.operators.dpc import IDPC

    out = IDPC().finalize([com])
    corr = np.corrcoef(out.data.ravel(), phase.ravel())[0, 1]
    assert corr > 0.999
    p = out.provenance.parameters["rotation"]
    found = p["rotation_deg_found"]
    assert (
        min(abs(found - math.degrees(theta)) % 360, 360 - abs(found - math.degrees(theta)) % 360)
        < 0.5
    )
    assert "skewness" in p["ambiguity_180"]
    assert out.units == "arb."


def test_idpc_on_demo_like_data_and_units(rng: np.random.Generator) -> None:
    """End to end: shifted probe disks -> CoM -> iDPC correlates with the true phase."""
    R, C, kr, kc = 24, 30, 32, 36
    phase = periodic_phase((R, C), rng)
    grad = spectral_gradient(phase)
    rr, cc = np.indices((kr, kc))
    data = np.empty((R, C, kr, kc), dtype=np.float64)
    for i in range(R):
        for j in range(C):
            cr, ccol = 15.2 + 3 * grad[0, i, j], 17.8 + 3 * grad[1, i, j]
            d = np.hypot(rr - cr, cc - ccol)
            data[i, j] = np.clip(7 - d, 0, 1) * 1000.0
    cal = qf.Calibration(
        scan_sampling=(0.4, 0.4),
        scan_units="Å",
        detector_sampling=(0.5, 0.5),
        detector_units="mrad",
        accelerating_voltage_kV=300,
    )
    ds = qf.open(data, calibration=cal)
    com = qf.center_of_mass(ds, center=(15.2, 17.8))
    (ph,) = qf.compute(qf.idpc(com), client="synchronous")
    assert ph.units == "rad"
    assert ph.shape == (R, C)
    corr = np.corrcoef(ph.data.ravel(), phase.ravel())[0, 1]
    assert corr > 0.95
    assert ph.provenance.derived_from[0]["operator"] == "center_of_mass"
    assert ph.provenance.parameters["boundary"].startswith("periodic")
