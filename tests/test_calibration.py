from __future__ import annotations

import math

import pytest

import quantem_flow as qf
from quantem_flow.calibration import electron_wavelength_angstrom, length_scale, normalize_units
from quantem_flow.errors import CalibrationError, ParameterError, UnitsError


def test_unit_aliases_and_unknown_units() -> None:
    assert normalize_units("A", kind="scan") == "Å"
    assert normalize_units("angstrom", kind="scan") == "Å"
    assert normalize_units("1/A", kind="detector") == "1/Å"
    with pytest.raises(UnitsError, match="furlong"):
        normalize_units("furlong", kind="scan")
    with pytest.raises(UnitsError):
        normalize_units("mrad", kind="scan")  # a scan step is never an angle


def test_wavelength_matches_known_values() -> None:
    assert electron_wavelength_angstrom(300) == pytest.approx(0.019687, rel=1e-4)
    assert electron_wavelength_angstrom(200) == pytest.approx(0.025079, rel=1e-4)
    with pytest.raises(ParameterError):
        electron_wavelength_angstrom(-1)


def test_length_conversion_and_px_is_not_a_length() -> None:
    assert length_scale("nm", "Å") == 10.0
    assert length_scale("pm", "nm") == pytest.approx(1e-3)
    with pytest.raises(CalibrationError, match="not a length"):
        length_scale("px", "Å")


def test_uncalibrated_detector_is_never_mrad() -> None:
    cal = qf.Calibration()
    assert cal.detector_scale("px") == (1.0, 1.0)
    with pytest.raises(CalibrationError, match="uncalibrated"):
        cal.detector_scale("mrad")


def test_reciprocal_to_mrad_needs_voltage() -> None:
    cal = qf.Calibration(detector_sampling=(0.01, 0.02), detector_units="1/A")
    with pytest.raises(CalibrationError, match="voltage"):
        cal.detector_scale("mrad")
    cal = cal.replace(accelerating_voltage_kV=300)
    lam = electron_wavelength_angstrom(300)
    sr, sc = cal.detector_scale("mrad")
    assert sr == pytest.approx(0.01 * lam * 1e3)
    assert sc == pytest.approx(0.02 * lam * 1e3)
    back = qf.Calibration(
        detector_sampling=(sr, sc), detector_units="mrad", accelerating_voltage_kV=300
    ).detector_scale("1/Å")
    assert back == pytest.approx((0.01, 0.02))


def test_axes_and_round_trip() -> None:
    cal = qf.Calibration(scan_sampling=(0.5, 0.25), scan_units="nm", detector_origin=(3.0, 4.5))
    r, c = cal.scan_axes((3, 5))
    assert (r.size, c.size, r.sampling, c.sampling, r.units) == (3, 5, 0.5, 0.25, "nm")
    kr, kc = cal.detector_axes((7, 9))
    assert kr.coordinates()[3] == 0.0 and kc.coordinates()[0] == -4.5
    assert qf.Calibration.from_dict(cal.to_dict()) == cal
    with pytest.raises(ParameterError, match="unknown calibration"):
        qf.Calibration.from_dict({"scan_step": 1})


@pytest.mark.parametrize("bad", [0, -1, math.nan, (1, 2, 3)])
def test_bad_sampling(bad: object) -> None:
    with pytest.raises(ParameterError):
        qf.Calibration(scan_sampling=bad)  # type: ignore[arg-type]
