"""Merlin ``.mib`` raw mode (``R64``): counter depths 1, 6, 12 and 24 decoded exactly."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import CorruptChunkError, FormatError
from quantem_flow.io import detect_format, open_source

from .conformance_cases_mib import CASES
from .writers_mib import encode_raw_frame, raw_header, write_raw_mib, write_raw_quad_mib

DTYPES = {1: np.uint8, 6: np.uint8, 12: np.uint16, 24: np.uint32}


def _frames(depth: int, n: int, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**depth - 1, size=(n, *shape), endpoint=True)
    a[0, 0, 0] = 2**depth - 1  # the largest count, every bit set
    return a.astype(DTYPES[depth])


@pytest.mark.parametrize("name", sorted(CASES))
def test_conformance_cases_read_exactly(name: str, tmp_path: Path) -> None:
    case = CASES[name](tmp_path, np.random.default_rng())
    src = open_source(case.target, **case.options)
    assert src.format == "mib" and src.shape == case.expected.shape
    assert src.dtype == case.expected.dtype
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)), case.expected)
    np.testing.assert_array_equal(src.read((1, 2), (1, 3)), case.expected[1:2, 1:3])
    buf = np.zeros((1, 3, *case.expected.shape[2:]), case.expected.dtype)
    out = src.read((0, 1), (0, 3), buffer=buf)
    np.testing.assert_array_equal(out, case.expected[:1])
    again = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(again.read((0, 2), (0, 3)), case.expected)


@pytest.mark.parametrize("depth", [1, 6, 12, 24])
def test_raw_depths_decode_a_known_pattern(depth: int, tmp_path: Path) -> None:
    # Pixel (r, c) of a 4 x 64 frame holds a value that differs in every word slot.
    frame = (np.arange(4 * 64).reshape(4, 64) * 37 + 5) % (2**depth)
    p = write_raw_mib(tmp_path / "k.mib", frame[None].astype(DTYPES[depth]), counter_depth=depth)
    src = open_source(p, scan_shape=(1, 1))
    assert src.shape == (1, 1, 4, 64)
    np.testing.assert_array_equal(src.read((0, 1), (0, 1))[0, 0], frame)
    md = src.metadata
    assert md["raw_mode"] is True and md["counter_depth"] == depth
    assert md["stored_dtype"] == f"R64 (raw, {depth}-bit counters)"


def test_one_bit_word_layout_by_hand(tmp_path: Path) -> None:
    # Documented layout: big-endian 64-bit word, pixel 0 in the least significant bit.
    word = (1 << 0) | (1 << 9) | (1 << 63)
    head = raw_header(1, width=64, height=1, counter_depth=1)
    p = tmp_path / "w.mib"
    p.write_bytes(head + word.to_bytes(8, "big"))
    frame = open_source(p, scan_shape=(1, 1)).read((0, 1), (0, 1))[0, 0, 0]
    assert np.flatnonzero(frame).tolist() == [0, 9, 63]


def test_twenty_four_bit_high_sub_frame_first(tmp_path: Path) -> None:
    head = raw_header(1, width=2 * 4, height=1, counter_depth=24)
    high = (0xABC | (0x001 << 16)).to_bytes(8, "big")  # pixel 0 high = 0xABC, pixel 1 high = 1
    low = (0x123 | (0xFFF << 48)).to_bytes(8, "big")  # pixel 0 low = 0x123, pixel 3 low = 0xFFF
    p = tmp_path / "h.mib"
    p.write_bytes(head + high + low)
    frame = open_source(p, scan_shape=(1, 1)).read((0, 1), (0, 1))[0, 0, 0]
    assert frame.tolist() == [0xABC123, 1 << 12, 0, 0xFFF]


def test_counter_depth_without_extended_header(tmp_path: Path) -> None:
    a = _frames(12, 2, (2, 32))
    p = write_raw_mib(tmp_path / "old.mib", a, counter_depth=12, extended=False)
    np.testing.assert_array_equal(open_source(p, scan_shape=(1, 2)).read((0, 1), (0, 2))[0], a)


def test_raw_file_is_detected_as_mib(tmp_path: Path) -> None:
    p = write_raw_mib(tmp_path / "noext", _frames(6, 1, (1, 8)), counter_depth=6)
    assert detect_format(p) == "mib"


def test_truncated_raw_file_raises(tmp_path: Path) -> None:
    p = write_raw_mib(tmp_path / "t.mib", _frames(12, 3, (4, 16)), counter_depth=12)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(FormatError) as info:
        open_source(p, scan_shape=(1, 3))
    msg = str(info.value)
    assert str(p) in msg and "raw 12-bit counters" in msg and "truncated" in msg


@pytest.mark.parametrize("depth_text", ["7", "x"])
def test_unknown_counter_depth_raises(depth_text: str, tmp_path: Path) -> None:
    head = raw_header(1, width=64, height=1, counter_depth=12).replace(
        b",12,", f",{depth_text},".encode()
    )
    p = tmp_path / "d.mib"
    p.write_bytes(head + bytes(128))
    with pytest.raises(FormatError) as info:
        open_source(p, scan_shape=(1, 1))
    assert str(p) in str(info.value) and "counter depth" in str(info.value)
    assert repr(depth_text) in str(info.value)


def test_lying_header_partial_word_raises(tmp_path: Path) -> None:
    p = tmp_path / "w.mib"
    p.write_bytes(raw_header(1, width=3, height=3, counter_depth=1) + bytes(8))
    with pytest.raises(FormatError) as info:
        open_source(p, scan_shape=(1, 1))
    assert str(p) in str(info.value) and "64-bit words" in str(info.value)


@pytest.mark.parametrize("depth", [1, 6, 12])
def test_quad_raw_frames_are_assembled(depth: int, tmp_path: Path) -> None:
    a = _frames(depth, 6, (128, 128))  # chips of 64 x 64
    p = write_raw_quad_mib(tmp_path / "q.mib", a, counter_depth=depth)
    src = open_source(p, scan_shape=(2, 3))
    assert src.shape == (2, 3, 128, 128) and src.dtype == DTYPES[depth]
    np.testing.assert_array_equal(src.read((0, 2), (0, 3)).reshape(a.shape), a)
    np.testing.assert_array_equal(src.read((1, 2), (2, 3))[0, 0], a[5])


def test_quad_orientation_by_hand(tmp_path: Path) -> None:
    # one marked pixel per quadrant, written as raw rows [chip 4, chip 3, chip 2, chip 1]
    s = 8
    chips = np.zeros((s, 4, s), dtype=np.uint8)  # (raw row, chip slot, x)
    chips[0, 3, 0] = 1  # chip 1, row 0, x 0 -> top-left corner
    chips[0, 2, s - 1] = 2  # chip 2, row 0, last x -> top-right corner
    chips[0, 1, 0] = 3  # chip 3, raw row 0, reversed -> bottom-left corner's right end
    chips[2, 0, 0] = 4  # chip 4, raw row 2, reversed -> row 2 s - 3, last column
    head = raw_header(1, width=4 * s, height=s, counter_depth=6, size=768, n_chips=4)
    p = tmp_path / "o.mib"
    p.write_bytes(head + encode_raw_frame(chips.reshape(-1), 6))
    frame = open_source(p, scan_shape=(1, 1)).read((0, 1), (0, 1))[0, 0]
    assert {
        (int(r), int(c)): int(frame[r, c]) for r, c in zip(*np.nonzero(frame), strict=True)
    } == {
        (0, 0): 1,
        (0, 2 * s - 1): 2,
        (2 * s - 1, s - 1): 3,
        (2 * s - 3, 2 * s - 1): 4,
    }


@pytest.mark.parametrize(
    ("depth", "width", "height", "chips", "expected"),
    [
        (24, 4 * 64, 64, 4, "only single chips and 2x2 quads of 1, 6 or 12 bits"),
        (6, 512, 512, 4, "a width of 4 x the chip height"),
        (12, 4 * 6, 6, 4, "do not fill whole 64-bit words"),
        (6, 512, 256, 2, "2-chip sensor"),
    ],
)
def test_unsupported_or_lying_multi_chip_headers_raise(
    depth: int, width: int, height: int, chips: int, expected: str, tmp_path: Path
) -> None:
    p = tmp_path / "q.mib"
    p.write_bytes(
        raw_header(1, width=width, height=height, counter_depth=depth, size=768, n_chips=chips)
    )
    with pytest.raises(FormatError) as info:
        open_source(p, scan_shape=(1, 1))
    assert str(p) in str(info.value) and expected in str(info.value)


def test_damaged_record_header_raises_at_read(tmp_path: Path) -> None:
    a = _frames(6, 3, (2, 8))
    p = write_raw_mib(tmp_path / "c.mib", a, counter_depth=6)
    src = open_source(p, scan_shape=(1, 3))
    record = len(raw_header(1, width=8, height=2, counter_depth=6)) + len(encode_raw_frame(a[0], 6))
    data = bytearray(p.read_bytes())
    data[2 * record] = ord("X")
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError) as info:
        src.read((0, 1), (0, 3))
    assert str(p) in str(info.value) and "frame 2" in str(info.value)
