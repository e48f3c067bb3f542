"""Format-specific behaviour of the readers: errors, scan-shape choices, metadata."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.calibration import Calibration
from quantem_flow.errors import (
    CorruptChunkError,
    DatasetPathError,
    FormatError,
    ScanShapeError,
    SourceNotFoundError,
)
from quantem_flow.io import detect_format, open_source

from . import writers

K = (6, 9)


def _frames(n: int, shape: tuple[int, int] = K, dtype: str = "uint16") -> np.ndarray:
    rng = np.random.default_rng()
    return rng.integers(1, 1000, size=(n, *shape)).astype(dtype)


# -- frame-ordered inputs, written with n frames, and how to open them ---------------------

FrameWriter = Callable[[Path, int], tuple[Path, dict[str, Any]]]


def _w_npy(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    return writers.write_npy(tmp / "f.npy", _frames(n)), {}


def _w_raw(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    p = writers.write_raw(tmp / "f.raw", _frames(n), dtype="<u2")
    return p, {"format": "raw", "dtype": "<u2", "frame_shape": K}


def _w_hdf5(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    return writers.write_hdf5(tmp / "f.h5", _frames(n), dataset_path="/f"), {"dataset_path": "/f"}


def _w_dectris(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    return writers.write_dectris(tmp, "f", _frames(n), frames_per_file=3), {}


def _w_zarr(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    return writers.write_zarr(tmp / "f.zarr", _frames(n), chunks=(2, *K)), {}


def _w_mib(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    return writers.write_mib(tmp / "f.mib", _frames(n, (256, 256), "uint8"), depth="U08"), {}


def _w_empad(tmp: Path, n: int) -> tuple[Path, dict[str, Any]]:
    a = np.zeros((1, n, 128, 128), np.float32)
    return writers.write_empad(tmp, "f", a, scan_shape_in_xml=False), {}


FRAME_WRITERS: dict[str, FrameWriter] = {
    "npy": _w_npy,
    "raw": _w_raw,
    "hdf5": _w_hdf5,
    "dectris": _w_dectris,
    "zarr": _w_zarr,
    "mib": _w_mib,
    "empad": _w_empad,
}


@pytest.mark.parametrize("name", sorted(FRAME_WRITERS))
def test_wrong_scan_shape_raises(name: str, tmp_path: Path) -> None:
    path, opts = FRAME_WRITERS[name](tmp_path, 12)
    with pytest.raises(ScanShapeError, match="12"):
        open_source(path, scan_shape=(5, 3), **opts)
    src = open_source(path, scan_shape=(3, 4), **opts)
    assert src.shape[:2] == (3, 4)


@pytest.mark.parametrize("name", sorted(FRAME_WRITERS))
def test_missing_scan_shape_explains_choices(name: str, tmp_path: Path) -> None:
    path, opts = FRAME_WRITERS[name](tmp_path, 12)
    with pytest.raises(ScanShapeError) as info:
        open_source(path, **opts)
    msg = str(info.value)
    assert "square" in msg
    assert "sidecar" in msg and ".json" in msg


@pytest.mark.parametrize("name", sorted(FRAME_WRITERS))
def test_square_scan_is_recorded(name: str, tmp_path: Path) -> None:
    path, opts = FRAME_WRITERS[name](tmp_path, 9)
    src = open_source(path, scan_shape="square", **opts)
    assert src.shape[:2] == (3, 3)
    assert len(src.notes) == 1 and "square" in src.notes[0]
    assert "square" in src.metadata["scan_shape_from"]


@pytest.mark.parametrize("name", sorted(FRAME_WRITERS))
def test_sidecar_gives_scan_shape_and_calibration(name: str, tmp_path: Path) -> None:
    path, opts = FRAME_WRITERS[name](tmp_path, 12)
    cal = {"scan_sampling": [2.5, 2.5], "scan_units": "Å"}
    writers.write_sidecar(path, (4, 3), calibration=cal)
    src = open_source(path, **opts)
    assert src.shape[:2] == (4, 3)
    assert src.metadata["scan_shape_from"].startswith("sidecar")
    if name in ("dectris", "empad"):  # the file records a calibration: the override is noted
        assert len(src.notes) == 1 and "sidecar's calibration overrides" in src.notes[0]
        assert src.metadata["calibration_from"].startswith("JSON sidecar")
    else:
        assert src.notes == []
    if name in ("dectris", "mib", "zarr", "empad"):
        assert src.calibration == Calibration(scan_sampling=(2.5, 2.5), scan_units="Å")


@pytest.mark.parametrize("name", sorted(FRAME_WRITERS))
def test_frame_offset_skips_leading_frames(name: str, tmp_path: Path) -> None:
    path, opts = FRAME_WRITERS[name](tmp_path, 8)
    full = open_source(path, scan_shape=(1, 8), **opts)
    src = open_source(path, scan_shape=(2, 3), frame_offset=2, **opts)
    assert src.metadata["frame_offset"] == 2
    np.testing.assert_array_equal(
        src.read((0, 2), (0, 3)).reshape(6, *src.shape[2:]), full.read((0, 1), (2, 8))[0]
    )


def test_dectris_sidecar_without_master_suffix(tmp_path: Path) -> None:
    master = writers.write_dectris(tmp_path, "acq", _frames(6))
    (tmp_path / "acq.json").write_text(json.dumps({"scan_shape": [2, 3]}))
    assert open_source(master).shape[:2] == (2, 3)


# -- missing inputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("x.npy", {}),
        ("x.raw", {"format": "raw", "dtype": "u2", "frame_shape": K}),
        ("x.h5", {"format": "hdf5", "dataset_path": "/d"}),
        ("x_master.h5", {"format": "dectris"}),
        ("x.zarr", {"format": "zarr"}),
        ("x.xml", {"format": "empad"}),
        ("x.mib", {"format": "mib"}),
        ("x.mib", {}),
    ],
)
def test_missing_file_raises(name: str, opts: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        open_source(tmp_path / name, **opts)


def test_dectris_missing_data_file(tmp_path: Path) -> None:
    master = writers.write_dectris(tmp_path, "acq", _frames(10), frames_per_file=4)
    (tmp_path / "acq_data_000002.h5").unlink()
    with pytest.raises(SourceNotFoundError) as info:
        open_source(master, scan_shape=(2, 5))
    msg = str(info.value)
    assert "acq_data_000002.h5" in msg
    assert str(master) in msg


def test_empad_missing_raw_file(tmp_path: Path) -> None:
    xml = writers.write_empad(tmp_path, "acq", np.zeros((2, 3, 128, 128), np.float32))
    (tmp_path / "acq.raw").unlink()
    with pytest.raises(SourceNotFoundError, match=r"acq\.raw"):
        open_source(xml)


# -- wrong paths inside containers ----------------------------------------------------------


def test_hdf5_wrong_dataset_path_lists_candidates(tmp_path: Path) -> None:
    p = writers.write_hdf5(tmp_path / "d.h5", _frames(4), dataset_path="/scan/frames")
    with pytest.raises(DatasetPathError) as info:
        open_source(p, dataset_path="/nope", scan_shape=(2, 2))
    assert "/scan/frames" in str(info.value)


def test_zarr_wrong_array_path_lists_candidates(tmp_path: Path) -> None:
    p = writers.write_zarr(tmp_path / "s.zarr", _frames(4), array_path="scan/frames")
    with pytest.raises(DatasetPathError) as info:
        open_source(p, array_path="scan/nope", scan_shape=(2, 2))
    assert "scan/frames" in str(info.value)
    # A group root needs array_path; the message lists the arrays (not the 1-D one).
    with pytest.raises(DatasetPathError) as info:
        open_source(p, scan_shape=(2, 2))
    assert "scan/frames" in str(info.value) and "notes" not in str(info.value)
    # A leading slash is accepted.
    assert open_source(p, array_path="/scan/frames", scan_shape=(2, 2)).shape == (2, 2, *K)


def test_zarr_root_array_refuses_array_path(tmp_path: Path) -> None:
    p = writers.write_zarr(tmp_path / "s.zarr", _frames(4))
    with pytest.raises(DatasetPathError, match="array_path=None"):
        open_source(p, array_path="data", scan_shape=(2, 2))


# -- corrupt and truncated data ---------------------------------------------------------------


def _corrupt_chunk(path: Path, dataset: str, index: int) -> None:
    """Overwrite the LZ4 blocks of one stored bitshuffle chunk with 0xFF bytes."""
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(index)
    assert info.size > 16
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 12)  # keep the 12-byte bitshuffle header
        fh.write(b"\xff" * (info.size - 12))


def test_hdf5_corrupt_chunk_raises(tmp_path: Path) -> None:
    a = _frames(12).reshape(3, 4, *K)
    p = writers.write_hdf5(tmp_path / "c.h5", a, dataset_path="/cube")
    _corrupt_chunk(p, "/cube", 5)  # scan position (1, 1)
    src = open_source(p, dataset_path="/cube")
    np.testing.assert_array_equal(src.read((0, 1), (0, 4)), a[:1])
    with pytest.raises(CorruptChunkError) as info:
        src.read((0, 3), (0, 4))
    assert str(p) in str(info.value)


def test_dectris_corrupt_chunk_names_data_file_and_frames(tmp_path: Path) -> None:
    a = _frames(12)
    master = writers.write_dectris(tmp_path, "acq", a, frames_per_file=5)
    data2 = tmp_path / "acq_data_000002.h5"
    _corrupt_chunk(data2, "/entry/data/data", 2)  # acquisition frame 7
    src = open_source(master, scan_shape=(3, 4))
    np.testing.assert_array_equal(src.read_frames(0, 7), a[:7])  # type: ignore[attr-defined]
    with pytest.raises(CorruptChunkError) as info:
        src.read((1, 2), (0, 4))
    msg = str(info.value)
    assert str(data2) in msg
    assert "[5, 8)" in msg  # acquisition frames read from that file
    assert str(master) in msg


def test_zarr_corrupt_chunk_raises(tmp_path: Path) -> None:
    p = writers.write_zarr(tmp_path / "z.zarr", _frames(8), chunks=(2, *K), compressor="zstd")
    chunk = p / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[6:] = b"\xff" * (len(data) - 6)
    chunk.write_bytes(bytes(data))
    src = open_source(p, scan_shape=(2, 4))
    with pytest.raises(CorruptChunkError) as info:
        src.read((0, 1), (0, 4))
    assert str(p) in str(info.value)


def test_raw_truncated_raises(tmp_path: Path) -> None:
    p = writers.write_raw(tmp_path / "t.raw", _frames(4), dtype="<u2")
    p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(FormatError, match="whole"):
        open_source(p, format="raw", dtype="<u2", frame_shape=K, scan_shape=(2, 2))


def test_mib_truncated_raises(tmp_path: Path) -> None:
    p = writers.write_mib(tmp_path / "t.mib", _frames(4, (256, 256)))
    size = p.stat().st_size
    p.write_bytes(p.read_bytes()[:-1000])
    with pytest.raises(FormatError) as info:
        open_source(p, scan_shape=(2, 2))
    msg = str(info.value)
    assert str(size - 1000) in msg and str(384 + 256 * 256 * 2) in msg


def test_empad_truncated_raises(tmp_path: Path) -> None:
    xml = writers.write_empad(tmp_path, "t", np.zeros((2, 2, 128, 128), np.float32))
    raw = tmp_path / "t.raw"
    raw.write_bytes(raw.read_bytes()[:-512])
    with pytest.raises(FormatError, match="truncated"):
        open_source(xml)


def test_mib_misaligned_records_raise(tmp_path: Path) -> None:
    # Junk between two records shifts the second header: the size check alone passes.
    p = tmp_path / "m.mib"
    h1 = writers.mib_header(1, depth="U08")
    h2 = writers.mib_header(2, depth="U08")[:-64]
    body = np.zeros((256, 256), ">u1").tobytes()
    p.write_bytes(h1 + body + b"\x00" * 64 + h2 + body)
    with pytest.raises(FormatError, match="MQ1"):
        open_source(p, scan_shape=(1, 2))


def test_not_a_mib_file_raises(tmp_path: Path) -> None:
    p = tmp_path / "junk.mib"
    p.write_bytes(b"\x00" * 5000)
    with pytest.raises(FormatError, match="MQ1"):
        open_source(p, scan_shape=(1, 1))


def test_mib_raw_mode_records_of_the_wrong_size_raise(tmp_path: Path) -> None:
    # R64 is decoded (tests/io/test_mib.py); 8 bytes a pixel is not a 12-bit raw record.
    p = writers.write_mib(tmp_path / "r.mib", _frames(2, (256, 256)), depth="R64")
    with pytest.raises(FormatError) as info:
        open_source(p, scan_shape=(1, 2))
    assert "raw 12-bit counters" in str(info.value) and "not a whole number" in str(info.value)


# -- metadata and format-specific choices ---------------------------------------------------


def test_dectris_metadata_and_mask_not_applied(tmp_path: Path) -> None:
    a = _frames(6)
    mask = np.zeros(K, np.uint32)
    mask[0, 0] = 1
    mask[2, 3] = 8
    master = writers.write_dectris(tmp_path, "acq", a, frames_per_file=4, pixel_mask=mask)
    src = open_source(master, scan_shape=(2, 3))
    md = src.metadata
    det = md["detector"]
    assert det["description"] == "Dectris ARINA"
    assert det["x_pixels_in_detector"] == K[1] and det["y_pixels_in_detector"] == K[0]
    assert det["bit_depth_image"] == 16
    assert det["count_time_units"] == "s"
    assert det["nimages"] == 6 and det["ntrigger"] == 1
    assert det["pixel_mask_shape"] == list(K) and det["pixel_mask_flagged"] == 2
    assert md["pixel_mask_applied_by_reader"] is False
    assert md["frames_announced"] == 6
    assert [Path(f["path"]).name for f in md["data_files"]] == [
        "acq_data_000001.h5",
        "acq_data_000002.h5",
    ]
    assert md["data_files"][0]["filters"][0]["id"] == 32008
    ident = src.identity
    assert len(ident.paths) == 3 and ident.paths[0] == str(master)
    # Masked pixels keep their stored values.
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)).reshape(6, *K), a)


def test_dectris_detected_by_content(tmp_path: Path) -> None:
    master = writers.write_dectris(tmp_path, "acq", _frames(4))
    renamed = master.rename(tmp_path / "acquisition.h5")
    assert detect_format(renamed) == "dectris"
    assert detect_format(tmp_path / "acq_data_000001.h5") == "hdf5"


def test_dectris_not_a_master(tmp_path: Path) -> None:
    p = writers.write_hdf5(tmp_path / "plain.h5", _frames(4), dataset_path="/d")
    with pytest.raises(FormatError, match="format='hdf5'"):
        open_source(p, format="dectris", scan_shape=(2, 2))


def test_empad_xml_scan_shape_and_override(tmp_path: Path) -> None:
    a = np.random.default_rng().standard_normal((2, 3, 128, 128)).astype(np.float32)
    xml = writers.write_empad(tmp_path, "acq", a, raw_subdir_in_xml="D:\\EMPAD\\data")
    src = open_source(xml)
    assert detect_format(xml) == "empad"
    assert src.shape == (2, 3, 128, 128)
    assert "acquire" in src.metadata["scan_shape_from"]
    assert src.metadata["xml"]["iom_measurements/high_voltage"] == "300000"
    assert src.metadata["xml_scan_shapes"]["acquire"] == [2, 3]
    assert src.notes == []
    # An explicit shape overrides the XML and the override is recorded.
    over = open_source(xml, scan_shape=(3, 2))
    assert over.shape[:2] == (3, 2)
    assert over.metadata["scan_shape_from"] == "given"
    assert any("overrides" in n for n in over.notes)
    np.testing.assert_array_equal(over.read((0, 3), (0, 2)), a.reshape(3, 2, 128, 128))


def test_empad_search_scan_parameters_fallback(tmp_path: Path) -> None:
    a = np.zeros((2, 3, 128, 128), np.float32)
    xml = writers.write_empad(tmp_path, "acq", a)
    # Acquire block wrong for the raw file, search block right.
    xml.write_text(
        '<root><raw_file filename="acq.raw"/>'
        '<scan_parameters mode="search"><scan_resolution_x>3</scan_resolution_x>'
        "<scan_resolution_y>2</scan_resolution_y></scan_parameters>"
        '<scan_parameters mode="acquire"><scan_resolution_x>9</scan_resolution_x>'
        "<scan_resolution_y>9</scan_resolution_y></scan_parameters></root>"
    )
    src = open_source(xml)
    assert src.shape[:2] == (2, 3)
    assert "search" in src.metadata["scan_shape_from"]
    assert any("search" in n for n in src.notes)


def test_empad_wrong_xml_shape_names_xml(tmp_path: Path) -> None:
    xml = writers.write_empad(tmp_path, "acq", np.zeros((2, 3, 128, 128), np.float32))
    xml.write_text(xml.read_text().replace(">3</scan_resolution_x>", ">4</scan_resolution_x>"))
    with pytest.raises(ScanShapeError, match="XML"):
        open_source(xml)


def test_empad_xml_without_raw_file(tmp_path: Path) -> None:
    xml = tmp_path / "bad.xml"
    xml.write_text("<root><type>scan</type></root>")
    with pytest.raises(FormatError, match="raw_file"):
        open_source(xml)


def test_empad_pix_fields(tmp_path: Path) -> None:
    a = np.zeros((2, 3, 128, 128), np.float32)
    xml = writers.write_empad(tmp_path, "acq", a, scan_shape_in_xml=False)
    xml.write_text(xml.read_text().replace("</root>", "<pix_x>3</pix_x><pix_y>2</pix_y></root>"))
    assert open_source(xml).shape[:2] == (2, 3)


def test_mib_metadata_and_hdr(tmp_path: Path) -> None:
    hdr = {
        "Time and Date Created": "2024/05/01 12:00:00",
        "Frames in Acquisition (Number)": "6",
        "Frames per Trigger (Number)": "3",
        "Counter Depth (number)": "12",
    }
    p = writers.write_mib(tmp_path / "q.mib", _frames(6, (512, 512)), quad=True, hdr=hdr)
    src = open_source(p, scan_shape=(2, 3))
    md = src.metadata
    assert md["header"]["header_bytes"] == 768
    assert md["header"]["n_chips"] == 4
    assert md["header"]["sensor_layout"] == "2x2"
    assert md["header"]["pixel_depth"] == "U16"
    assert md["quad"] is True
    assert md["stored_dtype"] == ">u2"
    assert md["last_sequence_number"] == 6
    assert md["hdr"]["Frames per Trigger (Number)"] == "3"
    assert len(src.identity.paths) == 2
    # The .hdr never sets the scan shape; the error says what its triggers suggest.
    with pytest.raises(ScanShapeError, match=r"3 frames per trigger.*scan_shape=\(2, 3\)"):
        open_source(p)


def test_mib_hdr_as_the_entry(tmp_path: Path) -> None:
    frames = _frames(6, (64, 64))
    hdr = {"Frames in Acquisition (Number)": "8", "Frames per Trigger (Number)": "2"}
    p = writers.write_mib(tmp_path / "scan.mib", frames, hdr=hdr)
    header = p.with_suffix(".hdr")
    by_header = qf.open(header, scan_shape=(2, 3))
    assert by_header.source.format == "mib" and by_header.source.path == p.resolve()
    np.testing.assert_array_equal(by_header.load_block((0, 2)), frames.reshape(2, 3, 64, 64))
    notes = " ".join(by_header.source.notes)
    assert "entry: the acquisition header 'scan.hdr'" in notes
    assert "declares 8 frames in the acquisition, but 'scan.mib' holds 6" in notes
    # the frames file missing: the project's error, naming what to do
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "other.hdr").write_text(header.read_text())
    with pytest.raises(SourceNotFoundError, match=r"no frames file 'other\.mib'"):
        qf.open(lone / "other.hdr", scan_shape=(2, 3))


# -- EMPAD: the scan shape rule and the XML's calibration (issue 15) -----------------------


def _empad_xml(raw_name: str, body: str) -> str:
    return f'<?xml version="1.0"?>\n<root><raw_file filename="{raw_name}"/>{body}</root>\n'


def _acquire(rows: int, cols: int, mode: str = "acquire") -> str:
    return (
        f'<scan_parameters mode="{mode}"><scan_resolution_x>{cols}</scan_resolution_x>'
        f"<scan_resolution_y>{rows}</scan_resolution_y></scan_parameters>"
    )


def test_empad_older_file_scan_shape_from_pix_fields(tmp_path: Path) -> None:
    # The issue's file: 16 frames, acquire parameters of another scan, root <pix_x>/<pix_y> 4x4.
    a = np.random.default_rng().standard_normal((4, 4, 128, 128)).astype(np.float32)
    xml = writers.write_empad(tmp_path, "scan_x4_y4", a)
    xml.write_text(
        _empad_xml("scan_x4_y4.raw", _acquire(256, 256) + "<pix_x>4</pix_x><pix_y>4</pix_y>")
    )
    src = open_source(xml)
    assert src.shape[:2] == (4, 4)
    assert src.metadata["scan_shape_from"].startswith("XML <pix_x>/<pix_y>")
    assert any("(256, 256) from XML <scan_parameters mode='acquire'>" in n for n in src.notes)
    np.testing.assert_array_equal(src.read((0, 4), (0, 4)), a)


def test_empad_pix_fields_give_a_rectangular_scan_before_search(tmp_path: Path) -> None:
    a = np.random.default_rng().standard_normal((2, 4, 128, 128)).astype(np.float32)
    xml = writers.write_empad(tmp_path, "acq", a)
    # search 8x1 also has 8 frames, but pix_x/pix_y come first in the rule.
    body = _acquire(9, 9) + _acquire(8, 1, "search") + "<pix_x>4</pix_x><pix_y>2</pix_y>"
    xml.write_text(_empad_xml("acq.raw", body))
    src = open_source(xml)
    assert src.shape[:2] == (2, 4)
    np.testing.assert_array_equal(src.read((1, 2), (0, 1))[0, 0], a[1, 0])


def test_empad_scan_shape_from_the_raw_file_name(tmp_path: Path) -> None:
    a = np.zeros((2, 3, 128, 128), np.float32)
    xml = writers.write_empad(tmp_path, "scan_x3_y2", a)
    xml.write_text(_empad_xml("scan_x3_y2.raw", _acquire(9, 9)))
    src = open_source(xml)
    assert src.shape[:2] == (2, 3)
    assert src.metadata["scan_shape_from"].startswith("raw file name 'scan_x3_y2.raw'")


def test_empad_no_recorded_shape_fits_lists_them_all(tmp_path: Path) -> None:
    xml = writers.write_empad(tmp_path, "acq", np.zeros((2, 3, 128, 128), np.float32))
    body = _acquire(9, 9) + _acquire(5, 5, "search") + "<pix_x>7</pix_x><pix_y>7</pix_y>"
    xml.write_text(_empad_xml("acq.raw", body))
    with pytest.raises(ScanShapeError) as info:
        open_source(xml)
    msg = str(info.value)
    for part in ("(9, 9) = 81 frames", "(7, 7) = 49 frames", "(5, 5) = 25 frames", "6 frames"):
        assert part in msg
    assert "scan_shape=(rows, cols)" in msg


def _empad_with_calibration(tmp_path: Path, fields: str, padding: int = 0) -> Path:
    xml = writers.write_empad(tmp_path, "acq", np.zeros((2, 3, 128, 128), np.float32))
    filler = "".join(f"<f{i}>{i}</f{i}>" for i in range(padding))
    body = _acquire(2, 3) + filler + f"<iom_measurements>{fields}</iom_measurements>"
    xml.write_text(_empad_xml("acq.raw", body))
    return xml


def test_empad_voltage_and_mrad_per_pixel_from_the_xml(tmp_path: Path) -> None:
    import quantem_flow as qf

    # 250 other fields first: the calibration is read wherever it is in the file.
    xml = _empad_with_calibration(
        tmp_path,
        "<high_voltage>300000</high_voltage>"
        "<calibrated_diffraction_angle>0.00025</calibrated_diffraction_angle>",
        padding=250,
    )
    expected = Calibration(
        detector_sampling=0.25, detector_units="mrad", accelerating_voltage_kV=300.0
    )
    src = open_source(xml)
    assert src.calibration == expected
    how = src.metadata["calibration_from"]
    assert "high_voltage = 300000 V -> 300 kV" in how
    assert "calibrated_diffraction_angle = 0.00025 rad/px -> 0.25 mrad/px" in how
    ds = qf.open(xml)
    assert ds.calibration == expected
    assert ds.describe()["calibration_from"] == how
    assert ds.describe()["scan_shape_from"] == "XML <scan_parameters mode='acquire'>"


def test_empad_second_generation_voltage_field(tmp_path: Path) -> None:
    xml = _empad_with_calibration(
        tmp_path, "<ColumnSourceHighVoltage>200000.0</ColumnSourceHighVoltage>"
    )
    cal = open_source(xml).calibration
    assert cal == Calibration(accelerating_voltage_kV=200.0)
    assert cal is not None and cal.detector_units == "px"


def test_empad_implausible_xml_values_are_not_used_and_noted(tmp_path: Path) -> None:
    xml = _empad_with_calibration(
        tmp_path,
        "<high_voltage>300</high_voltage>"  # kV written where volts belong
        "<calibrated_diffraction_angle>0.5</calibrated_diffraction_angle>",
    )
    src = open_source(xml)
    assert src.calibration is None
    assert any("0.3 kV, outside 10-2000 kV" in n for n in src.notes)
    assert any("500 mrad, outside (0, 100] mrad" in n for n in src.notes)


def test_an_explicit_calibration_wins_and_the_override_is_recorded(tmp_path: Path) -> None:
    import quantem_flow as qf
    from quantem_flow.operators.base import dataset_provenance

    xml = _empad_with_calibration(
        tmp_path,
        "<high_voltage>300000</high_voltage>"
        "<calibrated_diffraction_angle>0.00025</calibrated_diffraction_angle>",
    )
    given = Calibration(detector_sampling=0.3, detector_units="mrad", accelerating_voltage_kV=300)
    ds = qf.open(xml, calibration=given)
    assert ds.calibration == given
    prov = dataset_provenance(ds)["dataset"]
    assert prov["calibration_from"] == "given (calibration=)"
    over = prov["calibration_overridden"]
    assert over["from"].startswith("EMPAD XML")
    assert over["fields"] == {"detector_sampling": {"was": [0.25, 0.25], "now": [0.3, 0.3]}}
    assert over["calibration"]["detector_sampling"] == [0.25, 0.25]
    assert any("given calibration overrides" in n for n in ds.notes)
    # The same values as the file's: nothing is overridden.
    same = qf.open(xml, calibration=open_source(xml).calibration)
    assert "calibration_overridden" not in same.describe()
    # with_calibration later is recorded too.
    later = ds.with_calibration(accelerating_voltage_kV=200)
    assert later.describe()["calibration_from"] == "given (with_calibration)"
    assert later.describe()["calibration_overridden"]["fields"] == {
        "accelerating_voltage_kV": {"was": 300.0, "now": 200.0}
    }


# -- Dectris: calibration from the master (issue 15) ---------------------------------------


def _dectris_with(tmp_path: Path, **fields: tuple[str, float, str | None]) -> Path:
    """A Dectris master with extra ``group/name = (value, units)`` fields."""
    master = writers.write_dectris(tmp_path, "acq", _frames(6))
    with h5py.File(master, "a") as f:
        for key, (group, value, units) in fields.items():
            name = f"/entry/instrument/{group}/{key}"
            if name in f:
                del f[name]
            d = f.create_dataset(name, data=np.float64(value))
            if units is not None:
                d.attrs["units"] = np.bytes_(units.encode())
    return master


def test_dectris_calibration_from_the_master(tmp_path: Path) -> None:
    import math

    from quantem_flow.calibration import electron_wavelength_angstrom

    master = _dectris_with(
        tmp_path,
        beam_center_x=("detector", 4.5, "pixel"),
        beam_center_y=("detector", 2.25, "pixel"),
        incident_wavelength=("beam", electron_wavelength_angstrom(300.0), "angstrom"),
    )
    src = open_source(master, scan_shape=(2, 3))
    cal = src.calibration
    assert cal is not None
    # The writer records 100 um pixels (float32) at 0.1 m.
    px = float(np.float32(1e-4))
    mrad = 1e3 * math.atan(px / float(np.float32(0.1)))
    assert cal.detector_units == "mrad"
    assert cal.detector_sampling == pytest.approx((mrad, mrad), rel=1e-12)
    assert cal.detector_origin == (2.25, 4.5)
    assert cal.accelerating_voltage_kV == pytest.approx(300.0, rel=1e-9)
    how = src.metadata["calibration_from"]
    assert "beam_center_y/x = (2.25, 4.5) px" in how and "incident_wavelength" in how
    assert src.metadata["beam"]["incident_wavelength_units"] == "angstrom"


def test_dectris_lengths_in_mm_and_an_x_ray_energy(tmp_path: Path) -> None:
    master = _dectris_with(
        tmp_path,
        detector_distance=("detector", 200.0, "mm"),
        photon_energy=("detector/detectorSpecific", 8041.0, "eV"),
    )
    src = open_source(master, scan_shape=(2, 3))
    cal = src.calibration
    assert cal is not None and cal.accelerating_voltage_kV is None
    assert cal.detector_sampling == pytest.approx((0.5, 0.5), rel=1e-6)
    assert any("8.041 kV electrons, outside 10-2000 kV" in n for n in src.notes)


def test_dectris_unknown_length_units_leave_the_detector_uncalibrated(tmp_path: Path) -> None:
    master = _dectris_with(tmp_path, detector_distance=("detector", 3.0, "furlong"))
    src = open_source(master, scan_shape=(2, 3))
    assert src.calibration is None
    assert any("detector_distance = 3.0 with units 'furlong'" in n for n in src.notes)


# -- HDF5: which dataset (issue 15) --------------------------------------------------------


def test_hdf5_several_datasets_are_listed_with_shapes(tmp_path: Path) -> None:
    p = tmp_path / "multi.emd"
    with h5py.File(p, "w") as f:
        f["/data/cube_a"] = _frames(6).reshape(2, 3, *K)
        f["/data/cube_b"] = _frames(12).astype(np.float32).reshape(3, 4, *K)
        f["/data/stack"] = _frames(5)
        f["/dim1"] = np.arange(3)
    with pytest.raises(DatasetPathError) as info:
        open_source(p)
    msg = str(info.value)
    assert "holds 3 3-D/4-D datasets" in msg
    assert "'/data/cube_a' (2, 3, 6, 9) uint16" in msg
    assert "'/data/cube_b' (3, 4, 6, 9) float32" in msg
    assert "'/data/stack' (5, 6, 9) uint16" in msg
    assert "dim1" not in msg
    assert msg.index("cube_b") < msg.index("stack")  # 4-D first
    assert open_source(p, dataset_path="/data/cube_b").shape == (3, 4, *K)


def test_hdf5_the_only_cube_is_chosen_and_recorded(tmp_path: Path) -> None:
    p = tmp_path / "one.h5"
    with h5py.File(p, "w") as f:
        f["/a/cube"] = _frames(6).reshape(2, 3, *K)
        f["/a/image"] = np.zeros((2, 3))
    src = open_source(p)
    assert src.shape == (2, 3, *K)
    assert src.notes == [
        "dataset_path '/a/cube' chosen as the file's only 3-D/4-D dataset (shape (2, 3, 6, 9), "
        "uint16)"
    ]
    assert src.metadata["dataset_path_from"] == "the file's only 3-D/4-D dataset"


def test_hdf5_without_a_cube_lists_what_it_holds(tmp_path: Path) -> None:
    p = tmp_path / "none.h5"
    with h5py.File(p, "w") as f:
        f["/image"] = np.zeros((4, 5), np.float32)
    with pytest.raises(DatasetPathError, match=r"its datasets: '/image' \(4, 5\) float32"):
        open_source(p)


def test_cli_info_lists_hdf5_candidates_with_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quantem_flow.cli import main

    p = tmp_path / "two.h5"
    with h5py.File(p, "w") as f:
        f["/a"] = _frames(6).reshape(2, 3, *K)
        f["/b"] = _frames(4)
    assert main(["info", str(p)]) != 0
    err = capsys.readouterr().err
    assert "'/a' (2, 3, 6, 9) uint16" in err and "'/b' (4, 6, 9) uint16" in err


def test_counted_metadata_never_reads_a_variable_length_sequence_attribute(tmp_path: Path) -> None:
    # HDF5 trusts the sequence kind stored in the file: a damaged one crashes the process
    # (found by tests/fuzz_readers.py in EMD files); the counted reader reads attributes
    # through the same guard as the HDF5 and EMD readers.
    from quantem_flow.io.counted import CountedSource

    events = [np.array([1, 5], dtype=np.uint32) for _ in range(6)]
    p = writers.write_stempy(tmp_path / "c.h5", events, (2, 3), (4, 4))
    with h5py.File(p, "a") as f:
        value = np.empty(1, dtype=object)
        value[0] = np.array([1, 2], dtype="int32")
        vlen = h5py.vlen_dtype(np.dtype("int32"))
        f["electron_events/frames"].attrs.create("extra", value, dtype=vlen)
    src = CountedSource(p)
    assert src.metadata["frames_attributes"]["extra"].startswith("<not read:"), src.metadata
