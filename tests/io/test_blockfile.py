"""NanoMEGAS blockfile reader: exact reads, header calibration, damaged and lying files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import FormatError, ScanShapeError
from quantem_flow.io.blockfile import BlockfileSource, sniff

from .writers_blockfile import write_blockfile


def _data(shape: tuple[int, int, int] = (4, 6, 8)) -> np.ndarray:
    rng = np.random.default_rng()
    r, c, k = shape
    return rng.integers(0, 255, size=(r, c, k, k), endpoint=True).astype(np.uint8)


def test_reads_exactly_in_scan_order(tmp_path: Path) -> None:
    a = _data()
    src = BlockfileSource(write_blockfile(tmp_path / "a.blo", a))
    assert src.shape == (4, 6, 8, 8)
    assert src.dtype == np.uint8
    np.testing.assert_array_equal(src.read((0, 4), (0, 6)), a)
    np.testing.assert_array_equal(src.read((2, 3), (1, 5)), a[2:3, 1:5])
    np.testing.assert_array_equal(src.read_frames(7, 9), a.reshape(-1, 8, 8)[7:9])
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone.read((3, 4), (0, 6)), a[3:])


def test_header_gives_scan_shape_and_calibration(tmp_path: Path) -> None:
    a = _data((3, 5, 4))
    p = write_blockfile(tmp_path / "c.blo", a, step_nm=(2.0, 0.5), beam_energy_v=300000)
    src = BlockfileSource(p)
    cal = src.calibration
    assert cal is not None
    assert cal.scan_sampling == (2.0, 0.5)  # (row step SY, column step SX)
    assert cal.scan_units == "nm"
    assert cal.accelerating_voltage_kV == 300.0
    assert cal.detector_units == "px"  # never claimed as an angle
    md = src.metadata
    assert md["scan_shape_from"] == "the blockfile header (NY, NX)"
    assert "SY, SX" in md["calibration_from"]
    assert md["header"]["NX"] == 5 and md["header"]["NY"] == 3
    assert md["note"] == "quantem-flow test"
    assert md["scan_rotation_deg"] == 12.5
    assert md["first_last_frame_numbers"] == [0, 14]


def test_zero_step_leaves_the_scan_uncalibrated(tmp_path: Path) -> None:
    p = write_blockfile(tmp_path / "z.blo", _data((2, 3, 4)), step_nm=(0.0, 0.0), beam_energy_v=0)
    src = BlockfileSource(p)
    assert src.calibration is None
    assert src.metadata["calibration_from"] is None


def test_given_scan_shape_overrides_and_is_noted(tmp_path: Path) -> None:
    a = _data((4, 6, 4))
    src = BlockfileSource(write_blockfile(tmp_path / "o.blo", a), scan_shape=(3, 8))
    assert src.shape[:2] == (3, 8)
    assert any("overrides the scan shape (4, 6)" in n for n in src.notes)
    np.testing.assert_array_equal(src.read((0, 3), (0, 8)), a.reshape(3, 8, 4, 4))
    with pytest.raises(ScanShapeError, match=r"o\.blo"):
        BlockfileSource(tmp_path / "o.blo", scan_shape=(5, 5))
    with pytest.raises(ScanShapeError, match="'square' is not accepted"):
        BlockfileSource(tmp_path / "o.blo", scan_shape="square")  # type: ignore[arg-type]


def test_truncated_file_names_the_header_fields(tmp_path: Path) -> None:
    p = write_blockfile(tmp_path / "t.blo", _data((3, 4, 8)), truncate_by=10)
    with pytest.raises(FormatError, match=r"t\.blo.*NX=4, NY=3, DP_SZ=8.*truncated"):
        BlockfileSource(p)


def test_header_declaring_more_frames_than_stored(tmp_path: Path) -> None:
    p = write_blockfile(tmp_path / "l.blo", _data((3, 4, 8)), header_overrides={"NY": 5})
    with pytest.raises(FormatError, match=r"l\.blo.*NY=5.*truncated"):
        BlockfileSource(p)


def test_header_declaring_a_wrong_frame_size(tmp_path: Path) -> None:
    # DP_SZ 7 instead of 8: the file is large enough, but the records are misaligned.
    p = write_blockfile(tmp_path / "d.blo", _data((3, 4, 8)), header_overrides={"DP_SZ": 7})
    with pytest.raises(FormatError, match=r"d\.blo.*frame record 11.*DP_SZ=7"):
        BlockfileSource(p)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("DP_SZ", 0, "DP_SZ is 0"),
        ("NX", 0, "NX is 0"),
        ("Data_offset_1", 100, "Data_offset_1 is 100"),
        ("Data_offset_2", 4096, "Data_offset_2 is 4096"),
    ],
)
def test_lying_header_fields(tmp_path: Path, field: str, value: int, match: str) -> None:
    p = write_blockfile(tmp_path / "h.blo", _data((3, 4, 8)), header_overrides={field: value})
    with pytest.raises(FormatError, match=match):
        BlockfileSource(p)


def test_not_a_blockfile(tmp_path: Path) -> None:
    p = tmp_path / "x.blo"
    p.write_bytes(b"NOTBLO" + bytes(300))
    with pytest.raises(FormatError, match="IMGBLO"):
        BlockfileSource(p)
    p.write_bytes(b"IMGBLO")
    with pytest.raises(FormatError, match="fewer than the 240-byte"):
        BlockfileSource(p)


def test_sniff(tmp_path: Path) -> None:
    p = write_blockfile(tmp_path / "s.blo", _data((2, 3, 4)))
    assert sniff(p, p.read_bytes()[:4096])
    assert not sniff(p, b"MQ1,000001")
    assert not sniff(tmp_path, b"")


def test_detected_by_content_and_calibrated_by_open(tmp_path: Path) -> None:
    import quantem_flow as qf
    from quantem_flow.io import detect_format

    p = write_blockfile(tmp_path / "scan.data", _data((2, 3, 4)), step_nm=(4.0, 2.0))
    assert detect_format(p) == "blockfile"
    ds = qf.open(p)
    assert ds.shape == (2, 3, 4, 4)
    assert ds.calibration.scan_sampling == (4.0, 2.0)
    assert ds.calibration.scan_units == "nm"
