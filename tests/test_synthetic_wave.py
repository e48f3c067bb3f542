"""The wave-optics synthetic model: calibrated, consistent for SSB, DPC and virtual detectors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import DtypeError, ParameterError
from quantem_flow.operators.ssb import loss_reading
from quantem_flow.synthetic import synthetic_dataset, truth_of, write_synthetic

SMALL = {"model": "wave", "scan_shape": (24, 24), "detector_shape": (48, 48), "seed": 3}


def _r(a: np.ndarray, b: np.ndarray) -> float:
    x = np.asarray(a, float) - np.mean(a)
    y = np.asarray(b, float) - np.mean(b)
    return float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))


@pytest.fixture(scope="module")
def wave() -> tuple[np.ndarray, object]:
    return synthetic_dataset(**SMALL)


def test_the_data_are_calibrated_and_consistent(wave: tuple[np.ndarray, object]) -> None:
    data, truth = wave
    assert data.shape == (24, 24, 48, 48) and data.dtype == np.uint16
    cal = truth.calibration()  # type: ignore[attr-defined]
    assert cal.scan_units == "Å" and cal.detector_units == "mrad"
    assert cal.accelerating_voltage_kV == 300.0
    # one electron per frame before noise: the mean count is the dose (most lands on the detector)
    assert data.sum(axis=(2, 3)).mean() == pytest.approx(5e4, rel=0.05)
    # the bright-field disk has the semiangle's radius, at the stated beam centre
    probe = qf.find_probe(data.mean(axis=(0, 1)))
    assert probe.radius == pytest.approx(20.0 / 2.0, rel=0.05)  # 20 mrad / 2 mrad per px
    assert probe.center == pytest.approx(truth.probe_center, abs=0.3)  # type: ignore[attr-defined]
    again, _ = synthetic_dataset(**SMALL)
    np.testing.assert_array_equal(again, data)  # seeded


def test_ssb_and_idpc_recover_the_phase_and_wrong_parameters_show(
    wave: tuple[np.ndarray, object],
) -> None:
    data, truth = wave
    ds = qf.open(data, calibration=truth.calibration())  # type: ignore[attr-defined]
    right, wrong, idpc = qf.compute(
        qf.ssb(ds, voltage_kV=300, semiangle_mrad=20),
        qf.ssb(ds, voltage_kV=300, semiangle_mrad=20, defocus_A=120.0),
        qf.idpc(qf.center_of_mass(ds)),
        client="synchronous",
    )
    phase = truth.phase  # type: ignore[attr-defined]
    assert _r(right.phase, phase) > 0.95
    assert _r(idpc.data, phase) > 0.9
    good = right.provenance.parameters["quality"]
    bad = wrong.provenance.parameters["quality"]
    assert bad["double_overlap_loss"] > good["double_overlap_loss"] + 0.2
    assert _r(wrong.phase, phase) < _r(right.phase, phase) - 0.2
    assert bad["verdict"] == "high" and "defocus_A" in bad["reading"]
    assert any(n.startswith("quality: double-overlap loss") for n in right.provenance.notes)


def test_written_files_carry_the_calibration(tmp_path: Path) -> None:
    params = {**SMALL, "scan_shape": (8, 8), "detector_shape": (32, 32), "semiangle_mrad": 12.0}
    truth = truth_of(**params)
    for name in ("w.h5", "w.zarr"):
        path = write_synthetic(tmp_path / name, **params)
        ds = qf.open(path, dataset_path="/data") if name.endswith(".h5") else qf.open(path)
        assert ds.calibration == truth.calibration()
        assert (
            "quantem_flow" in ds.describe()["calibration_from"]
            or ds.calibration.detector_units == "mrad"
        )
    disk = write_synthetic(
        tmp_path / "d.h5", scan_shape=(4, 4), detector_shape=(24, 24), probe_radius_px=4
    )
    assert qf.open(disk, dataset_path="/data").calibration.detector_units == "px"  # claims nothing


def test_loss_reading_bands() -> None:
    assert loss_reading(0.05)["verdict"] == "low"
    assert loss_reading(0.4)["verdict"] == "moderate"
    assert loss_reading(0.9)["verdict"] == "high"
    assert loss_reading(float("nan"))["verdict"] == "high"
    assert "0.40" in loss_reading(0.4)["reading"]


def test_bad_parameters() -> None:
    with pytest.raises(ParameterError, match="does not fit"):
        truth_of(model="wave", scan_shape=(8, 8), detector_shape=(16, 16))
    with pytest.raises(ParameterError, match="semiangle_mrad"):
        truth_of(model="wave", semiangle_mrad=-1)
    with pytest.raises(ParameterError, match="model must be one of"):
        truth_of(model="ray")
    with pytest.raises(ParameterError, match="wave model's"):
        synthetic_dataset(scan_shape=(4, 4), detector_shape=(24, 24), voltage_kV=200)
    with pytest.raises(DtypeError, match="nothing is clipped"):
        synthetic_dataset(**{**SMALL, "scan_shape": (4, 4), "dose_per_frame": 5e8})
