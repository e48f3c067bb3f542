"""TVIPS reader: multi-file series, versions, rotator-index scan start, damaged and lying files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import FormatError, ScanShapeError
from quantem_flow.io.tvips import TvipsSource, sniff, tvips_series

from .writers_tvips import write_tvips


def _frames(n: int = 12, k: tuple[int, int] = (3, 5), dtype: str = "uint16") -> np.ndarray:
    rng = np.random.default_rng()
    return rng.integers(0, 250, size=(n, *k)).astype(dtype)


def test_series_read_across_file_boundaries(tmp_path: Path) -> None:
    f = _frames(12)
    p = write_tvips(tmp_path, "rec", f, frames_per_file=5)
    assert [x.name for x in tvips_series(p)] == [f"rec_00{i}.tvips" for i in range(3)]
    src = TvipsSource(p, scan_shape=(3, 4))
    np.testing.assert_array_equal(src.read((0, 3), (0, 4)), f.reshape(3, 4, 3, 5))
    np.testing.assert_array_equal(src.read_frames(3, 11), f[3:11])
    np.testing.assert_array_equal(src.read((1, 3), (1, 2)), f.reshape(3, 4, 3, 5)[1:3, 1:2])
    md = src.metadata
    assert md["frames_per_file"] == [5, 5, 2]
    assert md["header"]["dimx"] == 5 and md["header"]["dimy"] == 3
    assert md["first_frame_header"]["mode"] == 2
    assert len(src.identity.paths) == 3
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone.read((2, 3), (0, 4)), f[8:].reshape(1, 4, 3, 5))


def test_opening_a_later_file_reads_the_whole_series(tmp_path: Path) -> None:
    f = _frames(12)
    write_tvips(tmp_path, "rec", f, frames_per_file=5)
    src = TvipsSource(tmp_path / "rec_001.tvips", scan_shape=(3, 4))
    np.testing.assert_array_equal(src.read((0, 3), (0, 4)), f.reshape(3, 4, 3, 5))
    assert any("rec_000.tvips" in n for n in src.notes)


def test_missing_first_file(tmp_path: Path) -> None:
    write_tvips(tmp_path, "rec", _frames(12), frames_per_file=5)
    (tmp_path / "rec_000.tvips").unlink()
    with pytest.raises(FormatError, match=r"'rec_000\.tvips'.*does not exist"):
        TvipsSource(tmp_path / "rec_001.tvips", scan_shape=(3, 4))


@pytest.mark.parametrize(("version", "extra"), [(1, 0), (2, 0), (2, 12)])
def test_versions_and_frame_header_sizes(tmp_path: Path, version: int, extra: int) -> None:
    f = _frames(6, dtype="uint8")
    p = write_tvips(tmp_path, "v", f, version=version, extra_frame_header=extra)
    src = TvipsSource(p, scan_shape=(2, 3))
    assert src.dtype == np.uint8
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), f.reshape(2, 3, 3, 5))
    assert src.metadata["frame_header_bytes"] == (12 if version == 1 else 60 + extra)


def test_voltage_from_header(tmp_path: Path) -> None:
    src = TvipsSource(write_tvips(tmp_path, "a", _frames(6), ht_kv=200), scan_shape=(2, 3))
    assert src.calibration is not None
    assert src.calibration.accelerating_voltage_kV == 200.0
    assert src.calibration.scan_units == "px" and src.calibration.detector_units == "px"
    assert "ht" in src.metadata["calibration_from"]
    src0 = TvipsSource(write_tvips(tmp_path, "b", _frames(6), ht_kv=0), scan_shape=(2, 3))
    assert src0.calibration is None and src0.metadata["calibration_from"] is None


def test_frame_offset_skips_leading_frames(tmp_path: Path) -> None:
    f = _frames(14)
    src = TvipsSource(write_tvips(tmp_path, "o", f), scan_shape=(3, 4), frame_offset=2)
    np.testing.assert_array_equal(src.read((0, 3), (0, 4)), f[2:].reshape(3, 4, 3, 5))


def test_rotidx_start(tmp_path: Path) -> None:
    f = _frames(16)
    rot = np.array([0, 0, 0, *range(1, 13), 12], dtype=np.uint32)
    p = write_tvips(tmp_path, "r", f, rotidx=rot, frames_per_file=6)
    src = TvipsSource(p, scan_shape=(3, 4), frame_offset="rotidx")
    np.testing.assert_array_equal(src.read((0, 3), (0, 4)), f[3:15].reshape(3, 4, 3, 5))
    assert any("starts at frame 3" in n and "1 after it" in n for n in src.notes)
    assert src.metadata["frames_in_series"] == 16


def test_rotidx_with_dropped_positions_is_refused(tmp_path: Path) -> None:
    rot = np.array([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], dtype=np.uint32)
    p = write_tvips(tmp_path, "d", _frames(14), rotidx=rot)
    with pytest.raises(ScanShapeError, match="rotator index 13, not 12"):
        TvipsSource(p, scan_shape=(3, 4), frame_offset="rotidx")
    with pytest.raises(ScanShapeError, match="needs scan_shape"):
        TvipsSource(p, frame_offset="rotidx")
    v1 = write_tvips(tmp_path, "v1", _frames(12), version=1)
    with pytest.raises(ScanShapeError, match="without a rotator"):
        TvipsSource(v1, scan_shape=(3, 4), frame_offset="rotidx")


def test_truncated_last_file_names_it(tmp_path: Path) -> None:
    write_tvips(tmp_path, "t", _frames(12), frames_per_file=5, truncate_last_by=7)
    with pytest.raises(FormatError, match=r"t_002\.tvips.*not a whole number"):
        TvipsSource(tmp_path / "t_000.tvips", scan_shape=(3, 4))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("dimx", 6, "not a whole number"),
        ("bitsperpixel", 12, "bitsperpixel is 12"),
        ("version", 7, "version is 7"),
        ("frameheaderbytes", 4, "frameheaderbytes is 4"),
        ("size", 100, "size is 100"),
        ("dimy", 0, "dimy=0"),
    ],
)
def test_lying_header(tmp_path: Path, field: str, value: int, match: str) -> None:
    p = write_tvips(tmp_path, "h", _frames(12), header_overrides={field: value})
    with pytest.raises(FormatError, match=match):
        TvipsSource(p, scan_shape=(3, 4))


def test_scan_shape_must_match(tmp_path: Path) -> None:
    p = write_tvips(tmp_path, "s", _frames(12))
    with pytest.raises(ScanShapeError, match="needs 15 frames"):
        TvipsSource(p, scan_shape=(3, 5))


def test_sniff(tmp_path: Path) -> None:
    p = write_tvips(tmp_path, "x", _frames(2))
    head = p.read_bytes()[:4096]
    assert sniff(p, head)
    assert not sniff(tmp_path / "x_000.bin", head)
    assert not sniff(p, b"\x00" * 300)
    assert not sniff(tmp_path, b"")


def test_detected_by_content_and_opened(tmp_path: Path) -> None:
    import quantem_flow as qf
    from quantem_flow.io import detect_format

    f = _frames(6)
    p = write_tvips(tmp_path, "d", f, frames_per_file=4, ht_kv=120)
    assert detect_format(p) == "tvips"
    assert detect_format(tmp_path / "d_001.tvips") == "tvips"  # by its suffix
    ds = qf.open(p, scan_shape=(2, 3))
    assert ds.calibration.accelerating_voltage_kV == 120.0
    np.testing.assert_array_equal(
        ds.to_dask().compute(scheduler="synchronous"), f.reshape(2, 3, 3, 5)
    )
