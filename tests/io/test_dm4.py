"""Gatan ``.dm4`` 4-D data: both stored orders, calibrations, damaged files."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import FormatError, ShapeError
from quantem_flow.io import open_source
from quantem_flow.io.dm4 import Dm4Source, sniff

from .conformance_cases_dm4 import CASES
from .writers_dm4 import write_dm4_4d


def _data(dtype: str = "uint16", shape: tuple[int, ...] = (4, 3, 5, 8)) -> np.ndarray:
    return np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_conformance_cases_read_exactly(name: str, tmp_path: Path) -> None:
    case = CASES[name](tmp_path, np.random.default_rng())
    src = Dm4Source(case.target, **case.options)
    assert src.shape == case.expected.shape and src.dtype == case.expected.dtype
    np.testing.assert_array_equal(src.read((0, 5), (0, 7)), case.expected)
    np.testing.assert_array_equal(src.read((2, 4), (1, 6)), case.expected[2:4, 1:6])
    buf = np.zeros((1, 7, 6, 9), case.expected.dtype)
    out = src.read((4, 5), (0, 7), buffer=buf)
    assert np.shares_memory(out, buf)  # decoded into the caller's buffer
    np.testing.assert_array_equal(buf, case.expected[4:5])
    np.testing.assert_array_equal(
        pickle.loads(pickle.dumps(src)).read((0, 1), (0, 7)), case.expected[:1]
    )


@pytest.mark.parametrize("swapped", [True, False, None])
def test_both_orders_read_the_same_array(swapped: bool | None, tmp_path: Path) -> None:
    a = _data()
    src = open_source(write_dm4_4d(tmp_path / "x.dm4", a, swapped=swapped), format="dm4")
    assert src.shape == (4, 3, 5, 8)
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), a)
    np.testing.assert_array_equal(src.read((1, 2), (2, 3))[0, 0], a[1, 2])
    md = src.metadata
    assert md["stored_order"].startswith("C" if swapped else "hybrid")
    assert md["dimensions"] == ([8, 5, 3, 4] if swapped else [3, 4, 8, 5])
    assert md["scan_shape_from"] == "the file (ImageData/Dimensions)"
    json.dumps(md)


def test_hybrid_layout_by_hand(tmp_path: Path) -> None:
    # hybrid: for each detector pixel the whole scan image; value = 100 * pixel + frame
    R, C, kr, kc = 2, 3, 2, 2
    expected = np.zeros((R, C, kr, kc), "uint16")
    for f in range(R * C):
        for p in range(kr * kc):
            expected[f // C, f % C, p // kc, p % kc] = 100 * p + f
    path = write_dm4_4d(tmp_path / "h.dm4", expected, swapped=None)
    raw = path.read_bytes()
    run = np.array([100 * 1 + f for f in range(R * C)], "<u2").tobytes()  # detector pixel 1
    assert run in raw
    np.testing.assert_array_equal(Dm4Source(path).read((0, 2), (0, 3)), expected)


def test_calibration_from_tags(tmp_path: Path) -> None:
    p = write_dm4_4d(
        tmp_path / "c.dm4",
        _data(),
        swapped=None,
        scan_calibration=(0.5, 0.25, "nm"),
        detector_calibration=(0.02, 0.04, "1/nm"),
        detector_origin=(2.0, 3.5),
        voltage_V=200000.0,
    )
    cal = Dm4Source(p).calibration
    assert cal is not None
    assert cal.scan_units == "nm" and cal.scan_sampling == pytest.approx((0.5, 0.25))
    assert cal.detector_units == "1/Å"
    assert cal.detector_sampling == pytest.approx((0.002, 0.004))
    assert cal.detector_origin == (2.0, 3.5)
    assert cal.accelerating_voltage_kV == 200.0
    assert "DM4 tags" in Dm4Source(p).metadata["calibration_from"]


def test_micrometre_scan_and_mrad_detector(tmp_path: Path) -> None:
    p = write_dm4_4d(
        tmp_path / "u.dm4",
        _data(),
        scan_calibration=(0.002, 0.003, "µm"),
        detector_calibration=(0.5, 0.5, "mrad"),
    )
    cal = Dm4Source(p).calibration
    assert cal is not None
    assert cal.scan_units == "nm" and cal.scan_sampling == pytest.approx((2.0, 3.0))
    assert cal.detector_units == "mrad" and cal.detector_sampling == pytest.approx((0.5, 0.5))


def test_unknown_units_leave_axes_uncalibrated_with_a_note(tmp_path: Path) -> None:
    p = write_dm4_4d(
        tmp_path / "n.dm4",
        _data(),
        scan_calibration=(1.0, 1.0, "furlong"),
        detector_calibration=None,
        voltage_V=None,
    )
    src = Dm4Source(p)
    assert src.calibration is None
    assert any("furlong" in n for n in src.notes)


def test_scan_shape_reshapes_the_frames(tmp_path: Path) -> None:
    a = _data()
    src = Dm4Source(write_dm4_4d(tmp_path / "r.dm4", a, swapped=None), scan_shape=(2, 6))
    np.testing.assert_array_equal(src.read((0, 2), (0, 6)), a.reshape(2, 6, 5, 8))


def test_sniff(tmp_path: Path) -> None:
    p = write_dm4_4d(tmp_path / "s.dm4", _data())
    assert sniff(p, p.read_bytes()[:4096])
    assert not sniff(p, b"\x89HDF\r\n\x1a\n" + bytes(100))
    assert not sniff(p, b"")


@pytest.mark.parametrize("where", ["data", "tags after the data"])
def test_truncated_file_names_the_tag(where: str, tmp_path: Path) -> None:
    p = write_dm4_4d(tmp_path / "t.dm4", _data())
    raw = p.read_bytes()
    start = raw.index(np.arange(20, dtype="<u2").tobytes())  # the 4-D array's first values
    p.write_bytes(raw[: start + 100] if where == "data" else raw[:-400])
    with pytest.raises(FormatError) as info:
        Dm4Source(p)
    msg = str(info.value)
    assert str(p) in msg and "truncated" in msg
    tag = "ImageList/[1]/ImageData/Data" if where == "data" else "ImageList/[1]/ImageTags"
    assert tag in msg


def test_lying_dimensions_raise(tmp_path: Path) -> None:
    p = write_dm4_4d(tmp_path / "d.dm4", _data(), dimensions=[8, 5, 3, 5])
    with pytest.raises(ShapeError) as info:
        Dm4Source(p)
    msg = str(info.value)
    assert str(p) in msg and "ImageData/Dimensions [8, 5, 3, 5]" in msg


def test_lying_data_type_raises(tmp_path: Path) -> None:
    p = write_dm4_4d(tmp_path / "y.dm4", _data(), data_type=2)  # float32 over uint16 values
    with pytest.raises(FormatError) as info:
        Dm4Source(p)
    assert str(p) in str(info.value) and "ImageData/DataType 2" in str(info.value)


def test_dm3_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "old.dm3"
    p.write_bytes(b"\x00\x00\x00\x03" + bytes(60))
    with pytest.raises(FormatError) as info:
        Dm4Source(p)
    assert "DigitalMicrograph 3" in str(info.value)


def test_detected_by_content_under_any_name(tmp_path: Path) -> None:
    from quantem_flow.io import detect_format

    p = write_dm4_4d(tmp_path / "acquisition.bin", _data())
    assert detect_format(p) == "dm4"


def test_hybrid_read_in_several_scratch_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.io.dm4 as dm4

    monkeypatch.setattr(dm4, "_SCRATCH_BYTES", 3 * 5 * 8 * 2)  # three frames at a time
    monkeypatch.setattr(dm4, "_TRANSPOSE_BLOCK", 7)  # blocks that do not divide 40 pixels
    a = _data()
    src = Dm4Source(write_dm4_4d(tmp_path / "g.dm4", a, swapped=None))
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), a)
    np.testing.assert_array_equal(src.read((1, 3), (1, 3)), a[1:3, 1:3])


@pytest.mark.parametrize("swapped", [True, None])
def test_big_endian_file(swapped: bool | None, tmp_path: Path) -> None:
    a = _data("float32")
    p = write_dm4_4d(tmp_path / "b.dm4", a, swapped=swapped, big_endian=True)
    assert p.read_bytes()[12:16] == b"\x00\x00\x00\x00"  # byte-order flag 0
    src = Dm4Source(p)
    assert src.dtype == np.dtype("float32") and src.dtype.isnative
    assert src.metadata["stored_dtype"] == ">f4"
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), a)
    cal = src.calibration
    assert cal is not None and cal.accelerating_voltage_kV == 300.0


def test_several_4d_images_need_an_image_index(tmp_path: Path) -> None:
    a = _data()
    p = write_dm4_4d(tmp_path / "m.dm4", a, extra_4d=True)
    with pytest.raises(FormatError) as info:
        Dm4Source(p)
    assert "2 4-D images" in str(info.value) and "image_index=" in str(info.value)
    np.testing.assert_array_equal(Dm4Source(p, image_index=1).read((0, 4), (0, 3)), a)
    assert not Dm4Source(p, image_index=2).read((0, 4), (0, 3)).any()
    with pytest.raises(ShapeError):
        Dm4Source(p, image_index=0)  # the 2-D thumbnail


@pytest.mark.parametrize("scale", [-0.5, 0.0, float("nan")])
def test_implausible_scales_leave_axes_uncalibrated_with_a_note(
    scale: float, tmp_path: Path
) -> None:
    p = write_dm4_4d(
        tmp_path / "z.dm4",
        _data(),
        scan_calibration=(scale, 0.25, "nm"),
        detector_calibration=(0.02, scale, "1/nm"),
    )
    src = Dm4Source(p)
    cal = src.calibration
    assert cal is not None and cal.accelerating_voltage_kV == 300.0
    assert cal.scan_units == "px" and cal.detector_units == "px"
    assert sum("positive" in n for n in src.notes) == 2
    json.dumps(src.metadata)


def test_a_file_without_4d_data_is_described_for_what_it_holds(tmp_path: Path) -> None:
    a = _data()
    p = write_dm4_4d(tmp_path / "stack.dm4", a, dimensions=[a.shape[3], a.shape[2], 12])
    with pytest.raises(FormatError) as info:
        Dm4Source(p)
    text = str(info.value)
    assert "holds no 4-D STEM dataset" in text
    assert "an image" in text and "a stack or spectrum image" in text  # thumbnail, 3-D stack
    assert "image_index" not in text  # choosing an entry cannot help
    assert "qf.open(frames, scan_shape=(rows, cols))" in text


def test_dm3_and_dm4_tag_files_parse_alike(tmp_path: Path) -> None:
    """``parse_dm_tags`` reads both tag layouts (a K2 ``.gtg`` may be either)."""
    from quantem_flow.io.dm4 import parse_dm_tags

    from .writers_dm4 import dm3_bytes, dm4_bytes, text

    root = {
        "SI Dimensions": {"Size X": 35, "Size Y": 34},
        "Name": text("Capture"),
        "Steps": [0.5, 1.25],
        "Deep": {"A": {"B": {"C": np.float32(2.5)}}},
    }
    for version, raw in ((3, dm3_bytes(root)), (4, dm4_bytes(root))):
        path = tmp_path / f"tags.dm{version}"
        path.write_bytes(raw)
        tags, order, got_version = parse_dm_tags(path)
        assert (order, got_version) == ("<", version)
        assert tags["SI Dimensions"] == {"Size X": 35, "Size Y": 34}
        assert tags["Steps"] == {"[0]": 0.5, "[1]": 1.25}
        assert tags["Deep"]["A"]["B"]["C"] == 2.5
        assert "".join(map(chr, tags["Name"])) == "Capture"
        path.write_bytes(raw[: len(raw) // 2])
        with pytest.raises(FormatError, match="truncated"):
            parse_dm_tags(path)
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x00\x00\x00\x07" + bytes(20))
    with pytest.raises(FormatError, match="version 7"):
        parse_dm_tags(other)


def test_a_type_description_too_short_is_a_format_error(tmp_path: Path) -> None:
    from quantem_flow.io.dm4 import parse_dm_tags

    from .writers_dm4 import dm3_bytes

    raw = bytearray(dm3_bytes({"Name": {"Size X": 3}}))
    # the data tag "Size X": '%%%%', then the description length (uint32): make it 1 entry
    # of type 20 (an array), which needs 3
    at = raw.index(b"%%%%")
    raw[at + 4 : at + 8] = (1).to_bytes(4, "big")
    raw[at + 8 : at + 12] = (20).to_bytes(4, "big")
    path = tmp_path / "short.dm3"
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="too short for its kind"):
        parse_dm_tags(path)
