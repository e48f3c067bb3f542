"""Implausible parameters are refused with the measured value and the fix (issue 12, item 5).

A virtual detector (BF, ABF, ADF, annulus; the centre-of-mass mask) whose
requested region lies mostly off the detector, and an SSB semiangle that
disagrees with the bright-field disk measured from the data, raise
:class:`ImplausibleParameterError` at plan time, before any pass over the
data, unless ``allow_implausible=True``, which is recorded (parameters and a
note) and warned about.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    ImplausibleParameterError,
    ImplausibleParameterWarning,
    ParameterError,
)
from quantem_flow.operators import geometry
from tests.conftest import probe_data

SYNC = {"client": "synchronous"}

#: the README tour's detector: 0.9 mrad pixels binned by 2 (1.8 mrad); the synthetic
#: demo's 64 x 72 detector, binned to 32 x 36, reaches ~29 mrad beyond its centre
README_CAL = qf.Calibration(
    scan_sampling=0.5,
    scan_units="Å",
    detector_sampling=0.9,
    detector_units="mrad",
    accelerating_voltage_kV=300,
)


@pytest.fixture(scope="module")
def synthetic() -> tuple[np.ndarray, qf.SyntheticTruth]:
    return qf.synthetic_dataset(scan_shape=(12, 14), detector_shape=(64, 72))


# -- geometry helpers ------------------------------------------------------------------------
def test_on_detector_fraction_of_simple_regions() -> None:
    shape, center, one = (48, 48), (23.5, 23.5), (1.0, 1.0)
    # a disk well inside, a disk covering the detector, an annulus beyond every pixel
    assert geometry.on_detector_fraction(shape, center, one, 0.0, 10.0) == pytest.approx(1.0)
    assert geometry.on_detector_fraction(shape, center, one, 0.0, 500.0) == pytest.approx(
        48 * 48 / (math.pi * 500**2), rel=0.02
    )
    assert geometry.on_detector_fraction(shape, center, one, 40.0, 60.0) == 0.0
    # a disk whose radius is the half-width: the square's inscribed disk, all on
    assert geometry.on_detector_fraction(shape, center, one, 0.0, 24.0) == pytest.approx(1.0)
    # "to the edge" (outer = inf): the share of the inner circle on the detector
    assert geometry.on_detector_fraction(shape, center, one, 20.0, math.inf) == pytest.approx(1.0)
    assert geometry.on_detector_fraction(shape, center, one, 33.0, math.inf) == pytest.approx(
        1 - 8 * math.acos(24 / 33) / (2 * math.pi), abs=0.01
    )
    assert geometry.on_detector_fraction(shape, center, one, 0.0, math.inf) == 1.0


def test_detector_reach_in_calibrated_units() -> None:
    reach = geometry.detector_reach((32, 36), (15.5, 17.5), (1.8, 1.8), "mrad")
    assert reach.farthest == pytest.approx(math.hypot(15.5, 17.5) * 1.8)
    assert reach.nearest_edge == pytest.approx(15.5 * 1.8)
    text = reach.describe()
    assert "mrad" in text and f"{reach.farthest:.3g}" in text


# -- the three cases of the issue ------------------------------------------------------------
def test_readme_adf_beyond_the_detector_reach_is_refused(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth],
) -> None:
    """The README's 40-120 mrad ADF on a detector reaching ~29 mrad: refused, with the reach."""
    data, _ = synthetic
    ds = qf.open(data, calibration=README_CAL).bin_detector(2)
    with pytest.raises(ImplausibleParameterError) as info:
        qf.compute(qf.virtual_adf(ds, inner=40, outer=120, units="mrad"), **SYNC)
    msg = str(info.value)
    assert "inner=40" in msg and "outer=120" in msg and "mrad" in msg
    assert "reaches" in msg and "allow_implausible=True" in msg
    assert "inner" in info.value.parameters
    # the reach quoted is the detector's, in mrad: 32 x 36 pixels of 1.8 mrad, probe off-centre
    farthest = re.search(r"reaches ([0-9.]+) mrad", msg)
    nearest = re.search(r"([0-9.]+) mrad at its nearest edge", msg)
    assert farthest is not None and nearest is not None, msg
    assert 40 < float(farthest.group(1)) < 50 and 20 < float(nearest.group(1)) < 30
    assert f"inner < {nearest.group(1)} mrad" in msg and "outer=math.inf" in msg
    assert isinstance(info.value, ParameterError)  # callers catching ParameterError still do


def test_bf_radius_500_px_on_a_48_px_detector_is_refused(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(3, 4), det=(48, 48), center=(23.5, 23.5), radius=6.0)
    ds = qf.open(data)
    with pytest.raises(ImplausibleParameterError) as info:
        qf.compute(qf.virtual_bf(ds, radius=500), **SYNC)
    msg = str(info.value)
    assert "radius=500" in msg and "px" in msg
    assert "radius='auto'" in msg  # the fix, with the measured probe radius
    assert "measured probe radius" in msg
    assert info.value.parameters == ("radius",)


def test_ssb_semiangle_inconsistent_with_the_measured_disk_is_refused(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth],
) -> None:
    """Synthetic disk of 8 px at 0.9 mrad/px = 7.2 mrad; semiangle_mrad=20 is refused."""
    data, truth = synthetic
    ds = qf.open(data, calibration=README_CAL)
    with pytest.raises(ImplausibleParameterError) as info:
        qf.compute(qf.ssb(ds, voltage_kV=300, semiangle_mrad=20), **SYNC)
    msg = str(info.value)
    assert "semiangle_mrad=20" in msg
    found = re.search(r"measured ([0-9.]+) mrad", msg)
    assert found is not None, msg
    assert float(found.group(1)) == pytest.approx(truth.probe_radius * 0.9, rel=0.1)
    assert f"semiangle_mrad={found.group(1)}" in msg  # the fix: the measured value
    assert "allow_implausible=True" in msg
    assert info.value.parameters == ("semiangle_mrad",)


def test_ssb_with_the_measured_semiangle_runs(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth],
) -> None:
    data, truth = synthetic
    ds = qf.open(data, calibration=README_CAL)
    (obj,) = qf.compute(qf.ssb(ds, voltage_kV=300, semiangle_mrad=truth.probe_radius * 0.9), **SYNC)
    check = obj.provenance.parameters["semiangle_check"]
    assert check["consistent"] is True
    assert check["measured_mrad"] == pytest.approx(7.2, rel=0.1)
    assert not any("implausible" in n for n in obj.provenance.notes)


def test_ssb_semiangle_check_is_skipped_when_the_sampling_comes_from_the_disk(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth],
) -> None:
    """Uncalibrated detector: the sampling is semiangle / disk radius, nothing to compare."""
    data, _ = synthetic
    ds = qf.open(data, calibration=qf.Calibration(scan_sampling=0.5, scan_units="Å"))
    (obj,) = qf.compute(qf.ssb(ds, voltage_kV=300, semiangle_mrad=20), **SYNC)
    check = obj.provenance.parameters["semiangle_check"]
    assert check["consistent"] is None and "derived" in check["reason"]


# -- plausible geometry is accepted, and recorded ---------------------------------------------
def test_plausible_geometry_is_accepted_and_its_coverage_recorded(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth],
) -> None:
    data, _ = synthetic
    ds = qf.open(data, calibration=README_CAL).bin_detector(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImplausibleParameterWarning)
        bf, abf, adf, ring, com = qf.compute(
            qf.virtual_bf(ds),
            qf.virtual_abf(ds),
            qf.virtual_adf(ds, inner=15, outer=math.inf, units="mrad"),
            qf.virtual_annular(ds, inner=8, outer=22, units="mrad"),
            qf.center_of_mass(ds, mask_radius=20, mask_units="mrad"),
            **SYNC,
        )
    for r in (bf, abf, adf, ring, com):
        p = r.provenance.parameters
        assert p["allow_implausible"] is False
        assert p["plausibility"]["on_detector_fraction"] >= 0.5
        assert p["plausibility"]["minimum"] == 0.5
    assert ring.provenance.parameters["plausibility"]["reach"]["units"] == "mrad"


# -- the opt-out -----------------------------------------------------------------------------
def test_opt_out_is_recorded_in_provenance_and_warned(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth],
) -> None:
    data, _ = synthetic
    ds = qf.open(data, calibration=README_CAL).bin_detector(2)
    with pytest.warns(ImplausibleParameterWarning, match="inner=40"):
        (adf,) = qf.compute(
            qf.virtual_adf(ds, inner=40, outer=120, units="mrad", allow_implausible=True), **SYNC
        )
    p = adf.provenance.parameters
    assert p["allow_implausible"] is True
    assert p["plausibility"]["plausible"] is False
    assert p["plausibility"]["on_detector_fraction"] < 0.5
    assert any("allow_implausible=True" in n for n in adf.provenance.notes)
    assert adf.provenance.parameters["n_pixels"] > 0  # computed anyway


def test_ssb_opt_out_is_recorded(synthetic: tuple[np.ndarray, qf.SyntheticTruth]) -> None:
    data, _ = synthetic
    ds = qf.open(data, calibration=README_CAL)
    with pytest.warns(ImplausibleParameterWarning, match="semiangle_mrad"):
        (obj,) = qf.compute(
            qf.ssb(ds, voltage_kV=300, semiangle_mrad=20, allow_implausible=True), **SYNC
        )
    assert obj.provenance.parameters["given"]["allow_implausible"] is True
    assert obj.provenance.parameters["semiangle_check"]["consistent"] is False
    assert any("allow_implausible=True" in n for n in obj.provenance.notes)


def test_com_mask_mostly_off_the_detector_is_refused(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(3, 4), det=(20, 26))
    ds = qf.open(data)
    with pytest.raises(ImplausibleParameterError, match=r"mask_radius=100.*mask_radius=None"):
        qf.compute(qf.center_of_mass(ds, center=(8, 14), mask_radius=100), **SYNC)
    with pytest.warns(ImplausibleParameterWarning):
        (com,) = qf.compute(
            qf.center_of_mass(ds, center=(8, 14), mask_radius=100, allow_implausible=True),
            **SYNC,
        )
    assert com.provenance.parameters["allow_implausible"] is True


def test_the_check_reads_no_data(
    synthetic: tuple[np.ndarray, qf.SyntheticTruth], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Explicit centre and radii: refused before any chunk is read."""
    data, _ = synthetic
    ds = qf.open(data)
    read: list[object] = []
    real = type(ds.source).read

    def counting(self: object, *args: object, **kwargs: object) -> object:
        read.append(args)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(ds.source), "read", counting)
    with pytest.raises(ImplausibleParameterError):
        qf.compute(qf.virtual_bf(ds, radius=500, center=(30, 40)), **SYNC)
    assert read == []


def test_on_detector_fraction_fast_path_and_cache_equal_the_polar_grid() -> None:
    """Regions inside the detector are 1 without the grid; others are the grid's value."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        shape = (int(rng.integers(8, 200)), int(rng.integers(8, 200)))
        center = (float(rng.uniform(-10, shape[0] + 10)), float(rng.uniform(-10, shape[1] + 10)))
        scale = (float(rng.uniform(0.1, 2)), float(rng.uniform(0.1, 2)))
        inner = float(rng.uniform(0, 50))
        outer = inner + float(rng.uniform(0.1, 80)) if rng.random() < 0.8 else math.inf
        grid = geometry._polar_fraction.__wrapped__(shape, center, scale, inner, outer)
        assert geometry.on_detector_fraction(shape, center, scale, inner, outer) == grid
        assert geometry.on_detector_fraction(shape, center, scale, inner, outer) == grid  # cached
