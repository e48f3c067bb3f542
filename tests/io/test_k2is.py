"""Gatan K2 IS: the camera's real block size, sector synchronisation, damage, references.

Acquisitions come from :mod:`tests.io.writers_k2is` (the documented block layout).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    CorruptChunkError,
    FormatError,
    ParameterError,
    ScanShapeError,
    SourceNotFoundError,
)
from quantem_flow.io import detect_format
from quantem_flow.io.k2is import K2isSource

from .writers_k2is import write_k2is

FRAME = (6, 16)


def _frames(rng: np.random.Generator, n: int, shape: tuple[int, int] = FRAME) -> np.ndarray:
    return rng.integers(0, 4096, size=(n, *shape)).astype(np.uint16)


def test_the_cameras_geometry(tmp_path: Path, rng: np.random.Generator) -> None:
    """Sectors of 1860 x 256 in blocks of 930 x 16: 0x5758-byte blocks, 1860 x 2048 frames."""
    frames = _frames(rng, 2, (1860, 2048))
    gtg = write_k2is(tmp_path, frames, block=(930, 16))
    source = K2isSource(gtg, scan_shape=(1, 2))
    assert source.metadata["block_bytes"] == 0x5758
    assert source.shape == (1, 2, 1860, 2048) and source.dtype == np.uint16
    np.testing.assert_array_equal(source.read_frames(0, 2), frames)


def test_sectors_are_synchronised_by_frame_id(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 12)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), lead=(1, 0, 1, 1, 0, 1, 0, 0))
    source = K2isSource(gtg, scan_shape=(3, 4))
    np.testing.assert_array_equal(source.read_frames(0, 12), frames)
    assert source.metadata["first_blocks"] == [1, 0, 1, 1, 0, 1, 0, 0]
    assert any("synchronised at frame id 41" in n for n in source.notes)
    assert detect_format(gtg) == "k2is" and detect_format(tmp_path / "capture_5.bin") == "k2is"
    ds = qf.open(tmp_path / "capture_3.bin", scan_shape=(3, 4))
    (total,) = qf.compute(qf.sum_diffraction(ds), client="synchronous")
    np.testing.assert_array_equal(np.asarray(total), frames.sum(axis=0, dtype=np.int64))


def test_a_dropped_frame_is_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 6)
    write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=0)
    sector = tmp_path / "capture_4.bin"
    raw = bytearray(sector.read_bytes())
    block = 40 + 9  # 3 x 2 pixels, 12 bits each
    # frame id 43 (the third frame) loses its second block in sector 4
    del raw[(2 * 2 + 1) * block : (2 * 2 + 2) * block]
    sector.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match="frame id 43"):
        K2isSource(tmp_path / "capture.gtg", scan_shape=(1, 5))
    # damage after the scan does not matter: the frames before it open
    early = K2isSource(tmp_path / "capture.gtg", scan_shape=(1, 2))
    np.testing.assert_array_equal(early.read_frames(0, 2), frames[:2])


def test_damage_found_when_read(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 4)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=0)
    source = K2isSource(gtg, scan_shape=(2, 2))
    sector = tmp_path / "capture_2.bin"
    raw = bytearray(sector.read_bytes())
    raw[3 * 49] ^= 0xFF  # the sync word of block 3 (frame 1)
    sector.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"block 3 of .*capture_2\.bin.*frame 1"):
        source.read_frames(0, 4)


def test_missing_and_foreign_files(tmp_path: Path, rng: np.random.Generator) -> None:
    write_k2is(tmp_path, _frames(rng, 2), block=(3, 2))
    (tmp_path / "capture_8.bin").unlink()
    with pytest.raises(SourceNotFoundError, match="found 7"):
        K2isSource(tmp_path / "capture.gtg", scan_shape=(1, 2))
    other = tmp_path / "other"
    other.mkdir()
    for s in range(1, 9):
        (other / f"x_{s}.bin").write_bytes(b"\x00" * 200)
    with pytest.raises(FormatError, match="not a K2 IS sector file"):
        K2isSource(other / "x_1.bin", scan_shape=(1, 1))


def test_references_only_when_asked(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 4)
    gtg = write_k2is(tmp_path, frames, block=(3, 2))
    dark = rng.uniform(5, 10, size=FRAME).astype(np.float32)
    gain = rng.uniform(0.9, 1.1, size=FRAME).astype(np.float32)
    np.save(tmp_path / "dark.npy", dark)
    np.save(tmp_path / "gain.npy", gain)
    plain = K2isSource(gtg, scan_shape=(2, 2))
    assert plain.dtype == np.uint16 and plain.metadata["corrections"] == []
    fixed = K2isSource(
        gtg,
        scan_shape=(2, 2),
        corrections=("dark", "gain"),
        dark_map=tmp_path / "dark.npy",
        gain_map=tmp_path / "gain.npy",
    )
    assert fixed.dtype == np.float32
    np.testing.assert_array_equal(
        fixed.read_frames(0, 4), (frames.astype(np.float32) - dark) * gain
    )
    assert [r["kind"] for r in fixed.metadata["corrections"]] == ["dark", "gain"]
    with pytest.raises(ParameterError, match="without corrections"):
        K2isSource(gtg, scan_shape=(2, 2), gain_map=tmp_path / "gain.npy")


def _block_offset(block: int, size: int = 40 + 9) -> int:
    return block * size


def test_blocks_in_several_columns_are_placed(tmp_path: Path, rng: np.random.Generator) -> None:
    """Sectors two blocks wide (written right to left), so placement across columns counts."""
    frames = _frames(rng, 5, (6, 32))
    gtg = write_k2is(tmp_path, frames, block=(3, 2))
    source = K2isSource(gtg, scan_shape=(1, 5))
    assert source.metadata["block_shape"] == [3, 2]
    np.testing.assert_array_equal(source.read_frames(0, 5), frames)
    np.testing.assert_array_equal(source.read_frames(2, 4), frames[2:4])


def test_block_positions_must_tile_the_sector(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 3, (6, 32))
    gtg = write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=0)
    sector = tmp_path / "capture_8.bin"
    raw = bytearray(sector.read_bytes())
    # block 1 of the first frame claims block 0's place (x0, x1 of block 0: 2, 3)
    raw[_block_offset(1) + 28 : _block_offset(1) + 36] = raw[28:36]
    sector.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"capture_8\.bin.*do not tile"):
        K2isSource(gtg, scan_shape=(1, 3))


def test_a_block_moved_in_a_later_frame_is_found_when_read(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng, 4, (6, 32))
    gtg = write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=0)
    source = K2isSource(gtg, scan_shape=(2, 2))
    sector = tmp_path / "capture_6.bin"
    raw = bytearray(sector.read_bytes())
    at = _block_offset(2 * 4 + 1)  # frame 2, block 1 takes block 0's place
    raw[at + 28 : at + 36] = raw[_block_offset(8) + 28 : _block_offset(8) + 36]
    sector.write_bytes(bytes(raw))
    np.testing.assert_array_equal(source.read_frames(0, 2), frames[:2])
    with pytest.raises(CorruptChunkError, match=r"block 9 of .*capture_6\.bin.*frame 2.*elsewhere"):
        source.read_frames(1, 4)


def test_a_wrong_frame_id_inside_the_file_is_found_when_read(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Opening reads only a few headers; every header is checked when its frame is read."""
    frames = _frames(rng, 6)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=0)
    source = K2isSource(gtg, scan_shape=(2, 3))
    sector = tmp_path / "capture_7.bin"
    raw = bytearray(sector.read_bytes())
    raw[_block_offset(6) + 27] ^= 0x01  # frame 3's first block (2 blocks a frame) names id 45
    sector.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"block 6 of .*capture_7\.bin.*frame 3.*frame id"):
        source.read_frames(0, 6)


def test_a_dropped_frame_anywhere_is_refused_on_opening(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng, 40)
    write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=0)
    sector = tmp_path / "capture_2.bin"
    raw = bytearray(sector.read_bytes())
    del raw[_block_offset(2 * 29) : _block_offset(2 * 30)]  # frame id 41 + 29 lost whole
    sector.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"frame id 70 .*capture_2\.bin.*at most 29"):
        K2isSource(tmp_path / "capture.gtg", scan_shape=(5, 8))
    with pytest.raises(CorruptChunkError, match=r"at most 27 frames from frame_offset=2"):
        K2isSource(tmp_path / "capture.gtg", scan_shape=(2, 19), frame_offset=2)


def test_frames_left_at_the_end_are_noted(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 4)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), lead=(0,) * 8, tail=1)
    source = K2isSource(gtg, scan_shape=(2, 2))
    assert any("after frame id 44 left out" in n for n in source.notes)
    np.testing.assert_array_equal(source.read_frames(0, 4), frames)


def test_empty_and_short_sector_files(tmp_path: Path, rng: np.random.Generator) -> None:
    write_k2is(tmp_path, _frames(rng, 2), block=(3, 2))
    (tmp_path / "capture_5.bin").write_bytes(b"")
    with pytest.raises(CorruptChunkError, match=r"capture_5\.bin.*no frame complete"):
        K2isSource(tmp_path / "capture.gtg", scan_shape=(1, 2))
    (tmp_path / "capture_1.bin").write_bytes(b"\xff\xff\x00")
    with pytest.raises(FormatError, match="not a K2 IS sector file"):
        K2isSource(tmp_path / "capture.gtg", scan_shape=(1, 2))


def test_blocks_of_an_odd_width(tmp_path: Path, rng: np.random.Generator) -> None:
    """Pixel pairs straddle the block's rows when its width is odd (3 x 2 blocks here)."""
    frames = _frames(rng, 4, (4, 48))
    gtg = write_k2is(tmp_path, frames, block=(2, 3))
    source = K2isSource(gtg, scan_shape=(2, 2))
    assert source.metadata["block_shape"] == [2, 3]
    np.testing.assert_array_equal(source.read_frames(0, 4), frames)
    np.testing.assert_array_equal(source.read_frames(1, 3), frames[1:3])


@pytest.mark.parametrize("version", [3, 4])
def test_the_scan_shape_from_the_gtg(
    tmp_path: Path, rng: np.random.Generator, version: int
) -> None:
    frames = _frames(rng, 6)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), si_dimensions=(2, 3), gtg_version=version)
    source = K2isSource(gtg)
    assert source.shape[:2] == (2, 3)
    assert "SI Dimensions: Size Y 2 rows x Size X 3 cols" in source.metadata["scan_shape_from"]
    assert source.metadata["si_dimensions"] == [2, 3]
    np.testing.assert_array_equal(source.read((0, 2), (0, 3)), frames.reshape(2, 3, *FRAME))
    assert K2isSource(gtg, scan_shape=(3, 2)).shape[:2] == (3, 2)  # given wins


def test_the_scan_starts_where_the_shutter_opens(tmp_path: Path, rng: np.random.Generator) -> None:
    """Frames recorded before the shutter flag are left out; a .gtg scan starts one earlier."""
    frames = _frames(rng, 10)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), shutter_from=4, si_dimensions=(2, 3))
    scan = K2isSource(gtg)
    assert scan.metadata["shutter_first_frame"] == 4
    assert scan.metadata["frame_offset"] == 3
    assert any("one before the first frame flagged shutter-active (4)" in n for n in scan.notes)
    np.testing.assert_array_equal(scan.read((0, 2), (0, 3)), frames[3:9].reshape(2, 3, *FRAME))
    assert any(
        "1 frame(s) after the scan's 6 (from frame 9 on) are left out" in n for n in scan.notes
    )
    (tmp_path / "ts").mkdir()
    series_gtg = write_k2is(tmp_path / "ts", frames, block=(3, 2), shutter_from=4)
    series = K2isSource(series_gtg, scan_shape=(2, 3))
    assert series.metadata["frame_offset"] == 4  # no SI Dimensions: from the flagged frame
    assert any("the 4 frame(s) before it are left out" in n for n in series.notes)
    np.testing.assert_array_equal(series.read((0, 2), (0, 3)), frames[4:10].reshape(2, 3, *FRAME))
    given = K2isSource(gtg, frame_offset=1, scan_shape=(1, 6))
    assert any("frame_offset=1 given" in n for n in given.notes)
    np.testing.assert_array_equal(given.read((0, 1), (0, 6))[0], frames[1:7])
    with pytest.raises(ParameterError, match="'later'"):
        K2isSource(gtg, frame_offset="later")


def test_no_shutter_flag_and_a_damaged_gtg(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 4)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), shutter_from=99)
    source = K2isSource(gtg, scan_shape=(2, 2))
    assert source.metadata["shutter_first_frame"] is None
    assert any("no block is flagged shutter-active" in n for n in source.notes)
    np.testing.assert_array_equal(source.read_frames(0, 4), frames)
    gtg.write_bytes(b"\x00\x00\x00\x04" + bytes(10))  # cut short
    with pytest.raises(FormatError, match="pass scan_shape="):
        K2isSource(gtg)
    opened = K2isSource(gtg, scan_shape=(2, 2))
    assert any("the .gtg could not be read" in n for n in opened.notes)


def test_the_shutter_closing_after_the_scan(tmp_path: Path, rng: np.random.Generator) -> None:
    """The flag is cleared again when the shutter closes while the camera runs on."""
    frames = _frames(rng, 40)
    gtg = write_k2is(
        tmp_path, frames, block=(3, 2), shutter_from=21, shutter_until=27, si_dimensions=(2, 3)
    )
    scan = K2isSource(gtg)
    assert scan.metadata["shutter_first_frame"] == 21 and scan.metadata["frame_offset"] == 20
    np.testing.assert_array_equal(scan.read((0, 2), (0, 3)), frames[20:26].reshape(2, 3, *FRAME))
    with pytest.raises(ScanShapeError, match="after the shutter closed"):
        K2isSource(gtg, scan_shape=(2, 4))  # ends at frame 27: not flagged
    anyway = K2isSource(gtg, scan_shape=(2, 4), frame_offset=20)
    np.testing.assert_array_equal(anyway.read_frames(20, 28), frames[20:28])


def test_a_gtg_scan_flagged_from_its_first_whole_frame_is_noted(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    frames = _frames(rng, 6)
    gtg = write_k2is(tmp_path, frames, block=(3, 2), shutter_from=0, si_dimensions=(2, 3))
    source = K2isSource(gtg)
    assert source.metadata["frame_offset"] == 0
    assert any("already flagged shutter-active" in n for n in source.notes)
    with pytest.raises(ParameterError, match="frame_offset=-1"):
        K2isSource(gtg, frame_offset=-1)


def test_frames_after_a_sidecar_scan_are_left_out(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = _frames(rng, 8)
    gtg = write_k2is(tmp_path, frames, block=(3, 2))
    (tmp_path / "capture.json").write_text('{"scan_shape": [2, 3]}')
    source = K2isSource(gtg)
    assert source.shape[:2] == (2, 3)
    assert any("2 frame(s) after the scan's 6" in n for n in source.notes)
    np.testing.assert_array_equal(source.read((0, 2), (0, 3)), frames[:6].reshape(2, 3, *FRAME))
