"""Norpix StreamPix ``.seq``: detection, reference images applied only when asked, damage.

Files come from :mod:`tests.io.writers_seq` (the documented header layout) and
the reference images from the MRC writer of :mod:`tests.io.writers_mrc`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    FormatError,
    ParameterError,
    ShapeError,
    SourceNotFoundError,
    UnsupportedOperationError,
)
from quantem_flow.io import detect_format
from quantem_flow.io.seq import SeqSource

from .writers_mrc import write_mrc
from .writers_seq import write_seq

SCAN = (4, 6)
DET = (10, 12)


def _frames(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(100, 4000, size=(SCAN[0] * SCAN[1], *DET)).astype(np.uint16)


def test_reads_equal_the_frames_and_detected_by_content(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "movie.seq", frames)
    renamed = path.rename(tmp_path / "movie.bin")
    assert detect_format(renamed) == "seq"
    ds = qf.open(renamed, scan_shape=SCAN)
    assert ds.source.format == "seq" and ds.dtype == np.uint16
    (bf,) = qf.compute(qf.virtual_bf(ds, radius=3, center=(4.5, 5.5)), client="synchronous")
    (want,) = qf.compute(
        qf.virtual_bf(qf.open(frames.reshape(*SCAN, *DET)), radius=3, center=(4.5, 5.5)),
        client="synchronous",
    )
    np.testing.assert_array_equal(np.asarray(bf), np.asarray(want))
    meta = ds.source.metadata
    assert meta["version"] == 5 and meta["image_offset"] == 8192
    assert meta["frame_stride_bytes"] > meta["image_bytes"]  # timestamps between images


def test_references_are_applied_only_when_asked(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "movie.seq", frames)
    dark = rng.integers(50, 90, size=(1, *DET)).astype(np.float32)
    gain = rng.uniform(0.9, 1.1, size=(1, *DET)).astype(np.float32)
    write_mrc(Path(f"{path}.dark.mrc"), dark)
    write_mrc(Path(f"{path}.gain.mrc"), gain)
    plain = SeqSource(path, scan_shape=SCAN)
    assert plain.dtype == np.uint16 and plain.metadata["corrections"] == []
    assert any("dark reference" in n and "not applied" in n for n in plain.notes)
    np.testing.assert_array_equal(plain.read_frames(0, 3), frames[:3])
    fixed = SeqSource(path, scan_shape=SCAN, corrections=("dark", "gain"))
    assert fixed.dtype == np.float32
    want = (frames.astype(np.float32) - dark[0]) * gain[0]
    np.testing.assert_array_equal(fixed.read_frames(0, len(frames)), want)
    kinds = [c["kind"] for c in fixed.metadata["corrections"]]
    assert kinds == ["dark", "gain"] and all(
        len(c["sha256"]) == 64 for c in fixed.metadata["corrections"]
    )
    assert f"{path}.dark.mrc" in fixed.identity.paths
    assert fixed.identity.header_sha256 != plain.identity.header_sha256
    ds = qf.open(path, scan_shape=SCAN, corrections=["dark"])
    assert ds.dtype == np.float32
    np.testing.assert_array_equal(
        ds.source.read((0, 1), (0, 2)).reshape(2, *DET), frames[:2].astype(np.float32) - dark[0]
    )


def test_reference_errors(tmp_path: Path, rng: np.random.Generator) -> None:
    path = write_seq(tmp_path / "movie.seq", _frames(rng))
    with pytest.raises(SourceNotFoundError, match=r"movie\.seq\.gain\.mrc"):
        SeqSource(path, scan_shape=SCAN, corrections=("gain",))
    write_mrc(Path(f"{path}.dark.mrc"), np.zeros((1, 5, 5), np.float32))
    with pytest.raises(ShapeError, match=r"\(5, 5\).*\(10, 12\)"):
        SeqSource(path, scan_shape=SCAN, corrections=("dark",))
    with pytest.raises(ParameterError, match="unknown"):
        SeqSource(path, scan_shape=SCAN, corrections=("flat",))


def test_the_bad_pixel_map_is_reported_not_applied(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "movie.seq", frames)
    Path(f"{path}.Config.Metadata.xml").write_text("<Config/>")
    source = SeqSource(path, scan_shape=SCAN)
    assert source.metadata["bad_pixel_map"].endswith(".Config.Metadata.xml")
    assert any("bad-pixel map" in n for n in source.notes)
    np.testing.assert_array_equal(source.read_frames(0, 2), frames[:2])


def test_damaged_files(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "bad.seq", frames, header_overrides={"image_size_bytes": 7})
    with pytest.raises(FormatError, match="header is damaged"):
        SeqSource(path, scan_shape=SCAN)
    path = write_seq(tmp_path / "zip.seq", frames, header_overrides={"compression_format": 2})
    with pytest.raises(UnsupportedOperationError, match="compressed"):
        SeqSource(path, scan_shape=SCAN)
    path = write_seq(tmp_path / "depth.seq", frames, header_overrides={"bit_depth": 12})
    with pytest.raises(FormatError, match="12 bits"):
        SeqSource(path, scan_shape=SCAN)
    path = write_seq(tmp_path / "short.seq", frames[:1])
    path.write_bytes(path.read_bytes()[: 8192 + 100])  # the image offset, then 100 bytes
    with pytest.raises(FormatError, match="no whole frame"):
        SeqSource(path, scan_shape=(1, 1))
    path = write_seq(tmp_path / "tail.seq", frames, trailing=b"\x01" * 100)
    source = SeqSource(path, scan_shape=SCAN)
    assert any("100 bytes after the last whole frame" in n for n in source.notes)
    not_seq = tmp_path / "x.seq"
    not_seq.write_bytes(b"\x00" * 2048)
    with pytest.raises(FormatError, match="not a Norpix SEQ file"):
        SeqSource(not_seq, scan_shape=SCAN)


@pytest.mark.parametrize("version", [4, 5])
def test_32_bit_frames_are_corrected_in_float64(
    tmp_path: Path, rng: np.random.Generator, version: int
) -> None:
    """float32 would round 32-bit counts above 2**24; both header versions place the images."""
    frames = rng.integers(2**25, 2**31, size=(6, *DET)).astype(np.uint32)
    path = write_seq(tmp_path / "deep.seq", frames, version=version)
    dark = rng.integers(1, 9, size=(1, *DET)).astype(np.float32)
    write_mrc(Path(f"{path}.dark.mrc"), dark)
    fixed = SeqSource(path, scan_shape=(2, 3), corrections=("dark",))
    assert fixed.dtype == np.float64
    assert fixed.metadata["image_offset"] == (8192 if version >= 5 else 1024)
    want = frames.astype(np.float64) - dark[0].astype(np.float64)
    np.testing.assert_array_equal(fixed.read_frames(0, 6), want)
    assert np.any(want.astype(np.float32) != want)  # float32 would not have held them


def test_colour_images_are_refused_and_counts_compared(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng)
    bgrx = write_seq(tmp_path / "colour.seq", frames, header_overrides={"image_format": 500})
    with pytest.raises(UnsupportedOperationError, match=r"image format 500.*monochrome"):
        SeqSource(bgrx, scan_shape=SCAN)
    assert not any(
        "allocates" in n
        for n in SeqSource(write_seq(tmp_path / "movie.seq", frames), scan_shape=SCAN).notes
    )
    early = write_seq(
        tmp_path / "early.seq", frames, header_overrides={"allocated_frames": len(frames) + 3}
    )
    source = SeqSource(early, scan_shape=SCAN)
    assert any("allocates 27 frames; the file holds 24" in n for n in source.notes)
    np.testing.assert_array_equal(source.read_frames(0, len(frames)), frames)


_MAP = """<?xml version="1.0" encoding="utf-8"?>
<Configuration>
  <BadPixels>
    <BadPixelMap Rows="20" Columns="24" Binning="2">
      <Defect Row="1" Column="1"/>
    </BadPixelMap>
    <BadPixelMap Rows="{rows}" Columns="{cols}">
      <Defect Row="2" Column="3"/>
      <Defect Row="2" Column="4"/>
      <Defect Rows="7-8"/>
      <Defect Column="11"/>
      <Defect Row="0" Column="0"/>
    </BadPixelMap>
  </BadPixels>
</Configuration>
"""


def _patched_by_hand(frames: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Each bad pixel: the mean of its good neighbours in the 3 x 3 window (a plain loop)."""
    out = frames.astype(np.float32)
    rows, cols = bad.shape
    for r, c in zip(*np.nonzero(bad), strict=True):
        near = [
            (i, j)
            for i in range(max(r - 1, 0), min(r + 2, rows))
            for j in range(max(c - 1, 0), min(c + 2, cols))
            if not bad[i, j]
        ]
        out[:, r, c] = np.mean([frames[:, i, j].astype(np.float64) for i, j in near], axis=0)
    return out


def test_the_bad_pixel_map_is_applied_only_when_asked(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "movie.seq", frames)
    Path(f"{path}.Config.Metadata.xml").write_text(_MAP.format(rows=DET[0], cols=DET[1]))
    plain = SeqSource(path, scan_shape=SCAN)
    assert plain.dtype == np.uint16
    assert any("bad-pixel map" in n and "not applied" in n for n in plain.notes)
    patched = SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
    assert patched.dtype == np.float32
    bad = np.zeros(DET, dtype=bool)
    bad[2, 3] = bad[2, 4] = bad[0, 0] = True
    bad[7:9, :] = True
    bad[:, 11] = True
    np.testing.assert_allclose(
        patched.read_frames(0, len(frames)), _patched_by_hand(frames, bad), rtol=1e-6
    )
    (record,) = patched.metadata["corrections"]
    assert record["kind"] == "bad_pixels" and record["pixels"] == int(bad.sum())
    assert record["path"] in patched.identity.paths
    assert patched.identity.header_sha256 != plain.identity.header_sha256
    assert patched.frame_bytes(0, 1) is None  # patched values are not the stored bytes


def test_bad_pixel_maps_that_cannot_be_applied(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "movie.seq", frames)
    with pytest.raises(SourceNotFoundError, match=r"Config\.Metadata\.xml"):
        SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
    xml = Path(f"{path}.Config.Metadata.xml")
    xml.write_text(_MAP.format(rows=DET[0] + 2, cols=DET[1]))
    with pytest.raises(ShapeError, match=r"\[\(20, 24\), \(12, 12\)\].*\(10, 12\)"):
        SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
    xml.write_text(_MAP.format(rows=DET[0], cols=DET[1]).replace('Column="11"', 'Column="12"'))
    with pytest.raises(FormatError, match=r"Column='12'.*0\.\.11"):
        SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
    lonely = _MAP.format(rows=DET[0], cols=DET[1]).replace(
        '<Defect Row="0" Column="0"/>',
        ('<Defect Rows="0-2" Column="0"/><Defect Row="0" Column="1"/><Defect Row="1" Column="1"/>'),
    )
    xml.write_text(lonely.replace('<Defect Column="11"/>', '<Defect Row="2" Column="1"/>'))
    with pytest.raises(ShapeError, match=r"\(row 0, col 0\) has no good neighbour"):
        SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
    xml.write_text("<Configuration><BadPixels>")
    with pytest.raises(FormatError, match="not an XML bad-pixel map"):
        SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))


def test_the_de_metadata_is_recorded_not_interpreted(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path = write_seq(tmp_path / "movie.seq", _frames(rng))
    Path(f"{path}.metadata").write_bytes(bytes(range(256)) * 2)
    source = SeqSource(path, scan_shape=SCAN)
    assert source.metadata["de_metadata"]["path"].endswith("movie.seq.metadata")
    assert len(source.metadata["de_metadata"]["sha256"]) == 64
    assert any("not interpreted" in n for n in source.notes)


def test_bad_pixel_defects_are_read_strictly(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng)
    path = write_seq(tmp_path / "movie.seq", frames)
    xml = Path(f"{path}.Config.Metadata.xml")
    good = _MAP.format(rows=DET[0], cols=DET[1])
    xml.write_text(good)
    patched = SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
    assert patched.read_frames(3, 3).shape == (0, *DET)  # no frames: nothing to patch
    for bad, says in (
        ('<Defect Row="" Column="2"/>', "Row=''"),
        ('<Defect Rows="3-12"/>', "Rows='3-12'"),
        ('<Defect Row="2" Rows="3-4"/>', "both Row and Rows"),
    ):
        xml.write_text(good.replace('<Defect Row="0" Column="0"/>', bad))
        with pytest.raises(FormatError, match=says):
            SeqSource(path, scan_shape=SCAN, corrections=("bad_pixels",))
