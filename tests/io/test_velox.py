"""Velox ``.emd`` 4D-STEM camera stacks: exact reads, JSON calibration, detection, errors."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest

from quantem_flow.errors import DatasetPathError, FormatError, ScanShapeError, ShapeError
from quantem_flow.io import detect_format, open_source
from quantem_flow.io.velox import VeloxSource, sniff

from .conformance_cases_velox import CASES
from .writers_emd import write_emd
from .writers_velox import CAMERA_UUID, write_velox


def _data(shape: tuple[int, ...] = (4, 3, 5, 8)) -> np.ndarray:
    return np.arange(int(np.prod(shape))).reshape(shape).astype("uint16")


@pytest.mark.parametrize("name", sorted(CASES))
def test_conformance_cases_read_exactly(name: str, tmp_path: Path) -> None:
    case = CASES[name](tmp_path, np.random.default_rng())
    src = open_source(case.target, **case.options)
    assert src.format == "velox" and src.shape == case.expected.shape
    np.testing.assert_array_equal(src.read((0, 5), (0, 7)), case.expected)
    np.testing.assert_array_equal(src.read((1, 4), (2, 5)), case.expected[1:4, 2:5])
    buf = np.zeros((2, 7, 6, 9), case.expected.dtype)
    out = src.read((3, 5), (0, 7), buffer=buf)
    assert np.shares_memory(out, buf)
    np.testing.assert_array_equal(buf, case.expected[3:5])
    again = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(again.read((4, 5), (0, 7)), case.expected[4:5])


def test_frames_last_layout_by_hand(tmp_path: Path) -> None:
    a = _data()
    p = write_velox(tmp_path / "h.emd", a)
    with h5py.File(p) as f:
        stored = f[f"Data/Image/{CAMERA_UUID}/Data"][()]
    assert stored.shape == (5, 8, 12)
    np.testing.assert_array_equal(stored[:, :, 4], a[1, 1])  # frame 4 = scan (1, 1) of 3 cols
    np.testing.assert_array_equal(VeloxSource(p).read((1, 2), (1, 2))[0, 0], a[1, 1])


def test_calibration_from_json(tmp_path: Path) -> None:
    p = write_velox(
        tmp_path / "c.emd",
        _data(),
        pixel_size=(2.0e8, 4.0e8),
        offset=(-1.2e9, -5.0e8),
        voltage_V="200000",
        scan_pixel_m=(1e-10, 2e-10),
    )
    src = VeloxSource(p)
    cal = src.calibration
    assert cal is not None
    assert cal.detector_units == "1/Å" and cal.detector_sampling == pytest.approx((0.02, 0.04))
    assert cal.detector_origin == pytest.approx((2.5, 3.0))
    assert cal.accelerating_voltage_kV == 200.0
    assert cal.scan_units == "Å" and cal.scan_sampling == pytest.approx((1.0, 2.0))
    md = src.metadata
    assert md["scan_shape_from"] == "the file (Scan/ScanSize in the Velox metadata)"
    assert "Velox metadata" in md["calibration_from"]
    json.dumps(md)


def test_real_space_pixel_unit_leaves_detector_uncalibrated(tmp_path: Path) -> None:
    p = write_velox(tmp_path / "m.emd", _data(), pixel_unit="m", voltage_V=None, scan_pixel_m=None)
    src = VeloxSource(p)
    assert src.calibration is None
    assert any("reciprocal unit" in n for n in src.notes)
    assert any("scan was left uncalibrated" in n for n in src.notes)


def test_scan_size_that_does_not_fit_needs_a_dataset_path(tmp_path: Path) -> None:
    p = write_velox(tmp_path / "s.emd", _data(), scan_size=(5, 5))
    with pytest.raises(DatasetPathError) as info:
        VeloxSource(p)
    assert str(p) in str(info.value) and "Scan/ScanSize" in str(info.value)
    with pytest.raises(ScanShapeError):
        VeloxSource(p, dataset_path=f"/Data/Image/{CAMERA_UUID}")
    src = VeloxSource(p, dataset_path=f"/Data/Image/{CAMERA_UUID}/Data", scan_shape=(4, 3))
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), _data())


def test_four_d_data_is_refused(tmp_path: Path) -> None:
    p = write_velox(tmp_path / "f.emd", _data())
    with h5py.File(p, "a") as f:
        del f[f"Data/Image/{CAMERA_UUID}/Data"]
        f[f"Data/Image/{CAMERA_UUID}/Data"] = np.zeros((5, 8, 4, 3))
    with pytest.raises(ShapeError) as info:
        VeloxSource(p, dataset_path=f"/Data/Image/{CAMERA_UUID}")
    assert "(5, 8, 4, 3)" in str(info.value)


def test_damaged_metadata_json_raises(tmp_path: Path) -> None:
    p = write_velox(tmp_path / "j.emd", _data())
    with h5py.File(p, "a") as f:
        f[f"Data/Image/{CAMERA_UUID}/Metadata"][0, 0] = ord("#")
    with pytest.raises(FormatError) as info:
        VeloxSource(p, dataset_path=f"/Data/Image/{CAMERA_UUID}")
    assert str(p) in str(info.value) and "not JSON" in str(info.value)


def test_truncated_file_is_a_format_error(tmp_path: Path) -> None:
    p = write_velox(tmp_path / "t.emd", _data((6, 5, 32, 32)))
    p.write_bytes(p.read_bytes()[:4000])
    with pytest.raises(FormatError) as info:
        open_source(p, format="velox")
    assert str(p) in str(info.value)


def test_detection_tells_velox_from_emd_1_0(tmp_path: Path) -> None:
    v = write_velox(tmp_path / "velox.emd", _data())
    e = write_emd(tmp_path / "py4dstem.emd", _data())
    assert sniff(v, v.read_bytes()[:4096]) and not sniff(e, e.read_bytes()[:4096])
    assert detect_format(v) == "velox"
    assert detect_format(e) == "emd"


def test_h5py_key_error_at_read_is_a_corrupt_chunk_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a damaged object header makes h5py raise KeyError when the dataset is reopened to read
    from quantem_flow.errors import CorruptChunkError

    src = VeloxSource(write_velox(tmp_path / "k.emd", _data()))

    def broken() -> None:
        raise KeyError("Unable to synchronously open object (bad heap free list)")

    monkeypatch.setattr(src, "_dset", broken)
    with pytest.raises(CorruptChunkError) as info:
        src.read((0, 1), (0, 3))
    assert str(src.path) in str(info.value) and "frames [0, 3)" in str(info.value)


def test_frames_read_in_several_scratch_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.io.velox as velox

    monkeypatch.setattr(velox, "_SCRATCH_BYTES", 2 * 5 * 8 * 2)  # two frames at a time
    a = _data()
    src = VeloxSource(write_velox(tmp_path / "g.emd", a))
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), a)
    np.testing.assert_array_equal(src.read((1, 4), (0, 2)), a[1:4, :2])


@pytest.mark.parametrize("pixel_m", [1e-25, 1e300])
def test_implausible_scan_pixel_leaves_scan_uncalibrated(pixel_m: float, tmp_path: Path) -> None:
    p = write_velox(tmp_path / "z.emd", _data(), scan_pixel_m=(pixel_m, pixel_m))
    src = VeloxSource(p)
    cal = src.calibration
    assert cal is not None and cal.scan_units == "px" and cal.detector_units == "1/Å"
    assert any("finite, positive pixel size" in n for n in src.notes)


def test_detector_pixel_that_underflows_is_dropped_with_a_note(tmp_path: Path) -> None:
    p = write_velox(tmp_path / "u.emd", _data(), pixel_size=(1e-320, 1e-320))  # x 1e-10 -> 0
    src = VeloxSource(p)
    cal = src.calibration
    assert cal is not None and cal.detector_units == "px" and cal.scan_units == "Å"
    assert any("not finite and positive" in n for n in src.notes)


def _relayout(path: Path, stack: np.ndarray, **create: object) -> None:
    """Replace the camera stack's Data by ``stack`` (k_r, k_c, frames) stored as ``create`` says."""
    with h5py.File(path, "a") as f:
        group = f[f"Data/Image/{CAMERA_UUID}"]
        del group["Data"]
        group.create_dataset("Data", data=stack, **create)


_LAYOUTS = {
    "frame-chunks": {"chunks": (5, 8, 1)},
    "three-frame-chunks": {"chunks": (5, 8, 3)},  # 12 frames: edges inside chunks
    "big-endian-frame-chunks": {"chunks": (5, 8, 1), "dtype": ">u2"},
    "big-endian-contiguous": {"dtype": ">u2"},
    "gzip-frame-chunks": {"chunks": (5, 8, 1), "compression": "gzip"},
    "half-frame-chunks": {"chunks": (5, 4, 2)},
    "contiguous": {},
}


@pytest.mark.parametrize("scratch_frames", [1, 2, 1000])
@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_every_stored_layout_reads_exactly(
    layout: str, scratch_frames: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.io.velox as velox

    monkeypatch.setattr(velox, "_SCRATCH_BYTES", scratch_frames * 5 * 8 * 2)
    a = _data()
    p = write_velox(tmp_path / "l.emd", a)
    _relayout(p, np.ascontiguousarray(a.reshape(12, 5, 8).transpose(1, 2, 0)), **_LAYOUTS[layout])
    src = VeloxSource(p)
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), a)
    np.testing.assert_array_equal(src.read((1, 3), (1, 3)), a[1:3, 1:3])
    np.testing.assert_array_equal(src.read_frames(4, 11), a.reshape(12, 5, 8)[4:11])
    out = np.full((3, 5, 8), 7, dtype=src.dtype)
    assert src.read_frames(5, 8, out=out) is out
    np.testing.assert_array_equal(out, a.reshape(12, 5, 8)[5:8])


def test_a_chunk_never_written_reads_as_the_fill_value(tmp_path: Path) -> None:
    a = _data()
    p = write_velox(tmp_path / "f.emd", a)
    stack = a.reshape(12, 5, 8).transpose(1, 2, 0)
    with h5py.File(p, "a") as f:
        group = f[f"Data/Image/{CAMERA_UUID}"]
        del group["Data"]
        d = group.create_dataset("Data", shape=stack.shape, dtype="u2", chunks=(5, 8, 1))
        d.fillvalue  # noqa: B018 - 0 by default
        for i in (0, 1, 2, 5, 6, 7, 8, 9, 10, 11):  # frames 3 and 4 never written
            d[:, :, i] = stack[:, :, i]
    expected = a.reshape(12, 5, 8).copy()
    expected[3:5] = 0
    np.testing.assert_array_equal(VeloxSource(p).read_frames(0, 12), expected)


@pytest.mark.parametrize("contiguous", [False, True])
def test_a_file_truncated_after_open_is_a_corrupt_chunk_error(
    contiguous: bool, tmp_path: Path
) -> None:
    from quantem_flow.errors import CorruptChunkError

    p = write_velox(tmp_path / "t.emd", _data((4, 3, 32, 32)), chunks=not contiguous)
    src = VeloxSource(p)
    np.testing.assert_array_equal(src.read_frames(0, 1), _data((4, 3, 32, 32))[0, :1])
    with h5py.File(p, "r") as f:
        d = f[f"Data/Image/{CAMERA_UUID}/Data"]
        end = d.id.get_offset() + d.id.get_storage_size() if contiguous else None
        if end is None:
            end = max(d.id.get_chunk_info(i).byte_offset for i in range(d.id.get_num_chunks()))
    with open(p, "r+b") as fh:
        fh.truncate(end - 100)
    with pytest.raises(CorruptChunkError) as info:  # the open handle reads past the end
        src.read_frames(0, 12)
    assert str(p) in str(info.value) and "the file holds" in str(info.value)
    src.close()
