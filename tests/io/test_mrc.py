"""MRC reader: modes, byte order, DE scan metadata, extended header, damaged and lying files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import DtypeError, FormatError, ScanShapeError
from quantem_flow.io.mrc import MrcSource, sniff

from .writers_mrc import write_de_info, write_mrc


def _frames(n: int = 12, k: tuple[int, int] = (4, 5), dtype: str = "uint16") -> np.ndarray:
    rng = np.random.default_rng()
    return rng.integers(0, 255, size=(n, *k)).astype(dtype)


def test_reads_sections_as_frames(tmp_path: Path) -> None:
    f = _frames()
    p = write_mrc(tmp_path / "a.mrc", f, extended=bytes(1000))
    assert sniff(p, p.read_bytes()[:4096])
    src = MrcSource(p, scan_shape=(3, 4))
    assert src.shape == (3, 4, 4, 5)
    np.testing.assert_array_equal(src.read((0, 3), (0, 4)), f.reshape(3, 4, 4, 5))
    np.testing.assert_array_equal(src.read((1, 2), (1, 3)), f.reshape(3, 4, 4, 5)[1:2, 1:3])
    md = src.metadata
    assert md["extended_header_bytes"] == 1000
    assert md["header"]["EXTTYP"] == "FEI1"
    assert md["header"]["NVERSION"] == 20140
    assert md["header"]["labels"] == ["quantem-flow test stack"]
    assert md["calibration_from"] is None
    assert src.calibration is None
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone.read((2, 3), (0, 4)), f[8:].reshape(1, 4, 4, 5))


@pytest.mark.parametrize("dtype", ["int8", "int16", "float32", "uint16", "float16"])
@pytest.mark.parametrize("big", [False, True])
def test_modes_and_byte_orders(tmp_path: Path, dtype: str, big: bool) -> None:
    f = _frames(6, (3, 2), dtype)
    src = MrcSource(write_mrc(tmp_path / "m.mrc", f, big_endian=big), scan_shape=(2, 3))
    assert src.dtype == np.dtype(dtype)
    assert src.metadata["header"]["byte_order"] == ("big" if big else "little")
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), f.reshape(2, 3, 3, 2))


def test_imod_unsigned_bytes_are_read_unsigned_and_noted(tmp_path: Path) -> None:
    f = np.arange(24, dtype=np.uint8).reshape(6, 2, 2) + 200
    src = MrcSource(write_mrc(tmp_path / "u.mrc", f, imod_unsigned=True), scan_shape=(2, 3))
    assert src.dtype == np.uint8
    assert any("IMOD" in n for n in src.notes)
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), f.reshape(2, 3, 2, 2))


def test_de_info_gives_scan_shape_and_step(tmp_path: Path) -> None:
    f = _frames(10)
    p = write_mrc(tmp_path / "20240101_00002_movie.mrc", f)
    info = write_de_info(tmp_path / "20240101_00002_info.txt", (2, 5), step_nm=(1.5, 0.5))
    src = MrcSource(p)
    assert src.shape[:2] == (2, 5)
    assert src.metadata["scan_shape_from"].startswith("DE metadata")
    assert str(info.resolve()) in src.identity.paths
    cal = src.calibration
    assert cal is not None and cal.scan_sampling == (1.5, 0.5) and cal.scan_units == "nm"
    assert cal.detector_units == "px"
    assert "Specimen Pixel Size" in src.metadata["calibration_from"]
    assert src.metadata["de_info"]["Camera Model"] == "DE-16"
    # A given shape wins; info_file=False ignores the DE file.
    given = MrcSource(p, scan_shape=(5, 2))
    assert given.shape[:2] == (5, 2)
    assert any("overrides the scan shape (2, 5)" in n for n in given.notes)
    with pytest.raises(ScanShapeError, match="no scan shape was given"):
        MrcSource(p, info_file=False)


def test_de_info_that_does_not_match_names_the_file(tmp_path: Path) -> None:
    p = write_mrc(tmp_path / "x_1_movie.mrc", _frames(10))
    write_de_info(tmp_path / "x_1_info.txt", (3, 5))
    with pytest.raises(ScanShapeError, match=r"x_1_movie\.mrc.*\(3, 5\).*x_1_info\.txt"):
        MrcSource(p)


def test_non_raster_de_scan_is_refused(tmp_path: Path) -> None:
    p = write_mrc(tmp_path / "y_1_movie.mrc", _frames(10))
    write_de_info(tmp_path / "y_1_info.txt", (2, 5), scan_type="Serpentine")
    with pytest.raises(ScanShapeError, match="'Serpentine' scan"):
        MrcSource(p)


def test_truncated_file_names_the_header(tmp_path: Path) -> None:
    p = write_mrc(tmp_path / "t.mrc", _frames(12), truncate_by=3)
    with pytest.raises(FormatError, match=r"t\.mrc.*NZ=12.*truncated \(11 whole frames"):
        MrcSource(p, scan_shape=(3, 4))


def test_trailing_bytes_are_noted(tmp_path: Path) -> None:
    p = write_mrc(tmp_path / "tr.mrc", _frames(12), trailing=b"x" * 7)
    assert any("7 bytes after" in n for n in MrcSource(p, scan_shape=(3, 4)).notes)


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("NZ", 50, FormatError, "NZ=50"),
        ("NX", 0, FormatError, "NX is 0"),
        ("NSYMBT", -4, FormatError, "NSYMBT"),
        ("NSYMBT", 64, FormatError, "NSYMBT=64"),
        ("MODE", 4, DtypeError, "MODE is 4"),
    ],
)
def test_lying_header(
    tmp_path: Path, field: str, value: int, error: type[Exception], match: str
) -> None:
    p = write_mrc(tmp_path / "h.mrc", _frames(12), header_overrides={field: value})
    with pytest.raises(error, match=match):
        MrcSource(p, scan_shape=(3, 4))


def test_old_file_without_map_word(tmp_path: Path) -> None:
    f = _frames(6)
    p = write_mrc(tmp_path / "old.mrc", f, map_word=False)
    assert not sniff(p, p.read_bytes()[:4096])
    src = MrcSource(p, scan_shape=(2, 3))
    assert any("'MAP '" in n for n in src.notes)
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), f.reshape(2, 3, 4, 5))


def test_short_file(tmp_path: Path) -> None:
    p = tmp_path / "s.mrc"
    p.write_bytes(b"\x00" * 100)
    with pytest.raises(FormatError, match="fewer than the 1024-byte MRC header"):
        MrcSource(p)
    assert not sniff(p, p.read_bytes())


def test_detected_by_content_and_calibrated_by_open(tmp_path: Path) -> None:
    import quantem_flow as qf
    from quantem_flow.io import detect_format

    p = write_mrc(tmp_path / "a_1_movie.mrc", _frames(6))
    write_de_info(tmp_path / "a_1_info.txt", (2, 3), step_nm=(0.25, 0.5))
    assert detect_format(p) == "mrc"
    ds = qf.open(p)
    assert ds.shape == (2, 3, 4, 5)
    assert ds.calibration.scan_sampling == (0.25, 0.5)


@pytest.mark.parametrize(("unsigned", "dtype"), [(True, np.uint8), (False, np.int8)])
def test_mode0_signedness_can_be_given(tmp_path: Path, unsigned: bool, dtype: type) -> None:
    f = np.arange(24, dtype=np.uint8).reshape(6, 2, 2) + 120
    p = write_mrc(tmp_path / "b.mrc", f.view(np.int8))  # MODE 0, no IMOD stamp
    assert MrcSource(p, scan_shape=(2, 3)).dtype == np.int8
    src = MrcSource(p, scan_shape=(2, 3), mode0_unsigned=unsigned)
    assert src.dtype == dtype
    assert any(f"mode0_unsigned={unsigned}" in n for n in src.notes)
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), f.view(dtype).reshape(2, 3, 2, 2))
