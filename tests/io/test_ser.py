"""TIA .ser reader: row order, scan dimensions, .emi metadata, damaged and lying files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import DtypeError, FormatError, ScanShapeError
from quantem_flow.io.ser import SerSource, sniff

from .writers_ser import write_emi, write_ser


def _data(shape: tuple[int, int, int, int] = (3, 4, 5, 7), dtype: str = "uint16") -> np.ndarray:
    rng = np.random.default_rng()
    return rng.integers(0, 60000, size=shape).astype(dtype)


def test_rows_are_returned_top_first_and_noted(tmp_path: Path) -> None:
    a = _data()
    p = write_ser(tmp_path / "s_1.ser", a)
    # The writer stored the bottom row first, as TIA does.
    raw = p.read_bytes()
    assert sniff(p, raw[:4096])
    src = SerSource(p)
    first = src.read((0, 1), (0, 1))[0, 0]
    np.testing.assert_array_equal(first, a[0, 0])
    assert not np.array_equal(first, a[0, 0, ::-1])
    np.testing.assert_array_equal(src.read((0, 3), (0, 4)), a)
    np.testing.assert_array_equal(src.read((1, 3), (1, 3)), a[1:3, 1:3])
    assert any("bottom to top" in n for n in src.notes)
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone.read((2, 3), (0, 4)), a[2:])


@pytest.mark.parametrize("version", [0x0210, 0x0220])
def test_dimensions_give_scan_shape_and_step(tmp_path: Path, version: int) -> None:
    a = _data((2, 5, 4, 3), "float32")
    p = write_ser(tmp_path / "d_1.ser", a, version=version, step_m=(3e-10, 1e-9))
    src = SerSource(p)
    assert src.shape == (2, 5, 4, 3)
    cal = src.calibration
    assert cal is not None
    assert cal.scan_sampling == pytest.approx((0.3, 1.0))
    assert cal.scan_units == "nm"
    assert cal.detector_units == "px"
    assert cal.accelerating_voltage_kV is None  # no .emi
    md = src.metadata
    assert md["scan_shape_from"].startswith("the .ser dimension records")
    assert md["dimensions"][0]["units"] == "meters"
    assert md["element_calibration"]["x"]["delta"] == 1e7
    assert md["first_positions_m"][1] == pytest.approx([1e-9, 0.0])


def test_emi_gives_voltage_and_can_be_opened(tmp_path: Path) -> None:
    a = _data((2, 3, 4, 4))
    p = write_ser(tmp_path / "acq_1.ser", a)
    emi = write_emi(tmp_path / "acq.emi", high_tension_kv=200.0)
    src = SerSource(p)
    assert src.calibration is not None
    assert src.calibration.accelerating_voltage_kV == 200.0
    assert str(emi.resolve()) in src.identity.paths
    assert src.metadata["emi"]["ExperimentalDescription/High tension [kV]"] == "200.0"
    assert src.metadata["emi"]["AcquireInfo/CameraNamePath"] == "BM-Ceta"
    via_emi = SerSource(emi)
    np.testing.assert_array_equal(via_emi.read((0, 2), (0, 3)), a)
    assert any(".emi file" in n for n in via_emi.notes)


def test_non_metre_units_leave_the_scan_uncalibrated(tmp_path: Path) -> None:
    p = write_ser(tmp_path / "u_1.ser", _data((2, 3, 4, 4)), units="")
    assert SerSource(p).calibration is None


def test_one_dimensional_series_needs_a_scan_shape(tmp_path: Path) -> None:
    a = _data((3, 4, 2, 2))
    p = write_ser(tmp_path / "n_1.ser", a, ndim=1, positions=False)
    with pytest.raises(ScanShapeError, match=r"n_1\.ser.*12 frames"):
        SerSource(p)
    np.testing.assert_array_equal(SerSource(p, scan_shape=(3, 4)).read((0, 3), (0, 4)), a)


def test_aborted_acquisition_says_what_to_pass(tmp_path: Path) -> None:
    a = _data((3, 4, 2, 2))
    p = write_ser(tmp_path / "ab_1.ser", a, valid=8)
    with pytest.raises(ScanShapeError, match=r"ValidNumberElements is 8 of 12.*\(2, 4\)"):
        SerSource(p)
    np.testing.assert_array_equal(SerSource(p, scan_shape=(2, 4)).read((0, 2), (0, 4)), a[:2])


def test_column_major_scan_is_refused(tmp_path: Path) -> None:
    p = write_ser(tmp_path / "cm_1.ser", _data((3, 4, 2, 2)), column_major=True)
    with pytest.raises(FormatError, match=r"cm_1\.ser.*column by column"):
        SerSource(p)


def test_truncated_file(tmp_path: Path) -> None:
    # Drop all tags and part of the last element.
    p = write_ser(tmp_path / "t_1.ser", _data((2, 3, 4, 4)), positions=False, truncate_by=60)
    with pytest.raises(FormatError, match=r"t_1\.ser.*element 5.*truncated"):
        SerSource(p)


def test_lying_element_size(tmp_path: Path) -> None:
    p = write_ser(tmp_path / "e_1.ser", _data((2, 3, 4, 4)), element_overrides={"ArraySizeX": 4000})
    with pytest.raises(FormatError, match=r"e_1\.ser.*ArraySizeX=4000"):
        SerSource(p)


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("DataTypeID", 0x4120, FormatError, "1-D elements"),
        ("DataTypeID", 0x1234, FormatError, "DataTypeID is 0x1234"),
        ("ValidNumberElements", 99, FormatError, "ValidNumberElements is 99"),
        ("TotalNumberElements", 10**6, FormatError, "OffsetArrayOffset"),
    ],
)
def test_lying_header(
    tmp_path: Path, field: str, value: int, error: type[Exception], match: str
) -> None:
    p = write_ser(tmp_path / "h_1.ser", _data((2, 3, 4, 4)), header_overrides={field: value})
    with pytest.raises(error, match=match):
        SerSource(p)


def test_complex_elements_are_refused(tmp_path: Path) -> None:
    p = write_ser(tmp_path / "c_1.ser", _data((2, 3, 4, 4)), element_overrides={"DataType": 9})
    with pytest.raises(DtypeError, match="DataType is 9"):
        SerSource(p)


def test_not_a_ser_file(tmp_path: Path) -> None:
    p = tmp_path / "x.ser"
    p.write_bytes(b"MM" + bytes(100))
    assert not sniff(p, p.read_bytes())
    with pytest.raises(FormatError, match="TIA series header"):
        SerSource(p)
    assert not sniff(tmp_path, b"")


def test_detected_by_content_and_calibrated_by_open(tmp_path: Path) -> None:
    import quantem_flow as qf
    from quantem_flow.io import detect_format

    p = write_ser(tmp_path / "scan_1.ser", _data((2, 3, 4, 4)), step_m=(1e-9, 2e-9))
    write_emi(tmp_path / "scan.emi", high_tension_kv=80.0)
    assert detect_format(p) == "ser"
    assert detect_format(tmp_path / "scan.emi") == "ser"  # by its suffix
    ds = qf.open(p)
    assert ds.shape == (2, 3, 4, 4)
    assert ds.calibration.scan_sampling == pytest.approx((1.0, 2.0))
    assert ds.calibration.accelerating_voltage_kV == 80.0


def test_negative_step_keeps_the_magnitude_and_records_the_direction(tmp_path: Path) -> None:
    import quantem_flow as qf

    a = _data((3, 4, 6, 6))
    p = write_ser(tmp_path / "neg_1.ser", a, step_m=(-1.874e-9, 2e-10))
    ds = qf.open(p)
    cal = ds.calibration
    assert cal.scan_units == "nm"
    assert cal.scan_sampling == pytest.approx((1.874, 0.2))  # never silently dropped
    assert cal.scan_step_signs == (-1, 1)
    notes = " ".join(ds.source.notes)
    assert "negative scan step along rows" in notes and "scan_step_signs" in notes
    assert qf.Calibration.from_dict(cal.to_dict()) == cal  # survives YAML/JSON
    np.testing.assert_array_equal(ds.load_block((0, 3)), a)


def test_fixed_dpc_rotation_follows_the_scan_direction(tmp_path: Path) -> None:
    import quantem_flow as qf

    rng = np.random.default_rng(4)
    a = rng.poisson(5.0, size=(4, 5, 12, 12)).astype("uint16")
    up = qf.open(write_ser(tmp_path / "up_1.ser", a, step_m=(1e-9, 1e-9)))
    down = qf.open(write_ser(tmp_path / "down_1.ser", a, step_m=(-1e-9, 1e-9)))
    fields = []
    for ds in (up, down):
        (dpc,) = qf.compute(qf.dpc(ds, rotation_deg=30.0, transpose=False), client="synchronous")
        fields.append(dpc)
    np.testing.assert_allclose(fields[1].data[0], -fields[0].data[0])
    np.testing.assert_allclose(fields[1].data[1], fields[0].data[1])
    assert fields[1].provenance.parameters["scan_step_signs"] == [-1, 1]
    assert "scan_step_signs" not in fields[0].provenance.parameters


def _as_spectra(path: Path) -> Path:
    """Mark a written series as holding 1-D elements (DataTypeID 0x4120), as an EDS series does."""
    raw = bytearray(path.read_bytes())
    raw[6:10] = (0x4120).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    return path


def test_emi_with_several_series_opens_the_one_with_frames(tmp_path: Path) -> None:
    a = _data((2, 3, 4, 4))
    _as_spectra(write_ser(tmp_path / "eds_1.ser", _data((2, 3, 4, 4))))
    write_ser(tmp_path / "eds_2.ser", a)
    emi = write_emi(tmp_path / "eds.emi", high_tension_kv=300.0)
    src = SerSource(emi)
    assert src.path.name == "eds_2.ser"
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), a)
    assert any("eds_2.ser opened" in n and "eds_1.ser" in n for n in src.notes)
    # the spectra series itself: the error names the series with frames
    with pytest.raises(
        FormatError, match=r"spectra.*2-D frames of this acquisition are in \['eds_2\.ser'\]"
    ):
        SerSource(tmp_path / "eds_1.ser")
    # two series of frames: asked which
    write_ser(tmp_path / "eds_3.ser", a)
    with pytest.raises(FormatError, match="several series of 2-D frames"):
        SerSource(emi)
