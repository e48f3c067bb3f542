"""Merlin ``.mib`` raw-mode (``R64``) files written from the documented layout.

Independent of :mod:`quantem_flow.io.merlin`: every 64-bit word is built
pixel by pixel with Python integers.  A raw frame is a stream of big-endian
64-bit words, each holding ``64 / slot`` pixels in slots of ``slot`` bits
(1 bit for 1-bit counters, 8 for 6-bit, 16 for 12-bit), the first pixel in
the least significant slot.  A 24-bit frame is two 12-bit sub-frames (high
12 bits first) after one header that declares twice the frame's width.

A raw 2x2 quad of ``s x s`` chips declares width ``4 s`` and height ``s``;
raw row ``j`` holds, in this order, the bottom-right and bottom-left
quadrants' row ``2 s - 1 - j`` reversed, then the top-right and top-left
quadrants' row ``j`` (chips 4, 3, 2, 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["SLOT_BITS", "encode_raw_frame", "raw_header", "write_raw_mib", "write_raw_quad_mib"]

#: Counter depth -> bits of one pixel's slot in a 64-bit word.
SLOT_BITS = {1: 1, 6: 8, 12: 16, 24: 16}
_DACS = ",".join(["000"] * 8 + ["100"] * 17)


def raw_header(
    sequence: int,
    *,
    width: int,
    height: int,
    counter_depth: int,
    size: int = 384,
    n_chips: int = 1,
    extended: bool = True,
) -> bytes:
    """One MQ1 header of a raw-mode frame, NUL-padded to ``size`` bytes.

    ``width`` is the width the header declares (for 24 bits, twice the
    frame's).  ``extended=False`` leaves out the ``MQ1A`` block, so the
    counter depth is the last field (older firmware).
    """
    fields = [
        "MQ1",
        f"{sequence:06d}",
        f"{size:05d}",
        f"{n_chips:02d}",
        f"{width:05d}",
        f"{height:05d}",
        "R64",
        "   2x2" if n_chips == 4 else "   1x1",
        "0F" if n_chips == 4 else "01",
        "2025-01-02 03:04:05.000006",
        "0.000500",
        "0",
        "0",
        "0",
        "1.200000E+1",
        "5.110000E+2",
        *(["0.000000E+0"] * 6),
        "3RX",
        _DACS,
    ]
    if extended:
        fields += ["MQ1A", "2025-01-02T03:04:05.000006000Z", "500000ns"]
    fields.append(str(counter_depth))
    text = (",".join(fields) + ",").encode("ascii")
    assert len(text) <= size, len(text)
    return text.ljust(size, b"\x00")


def _words(pixels: list[int], slot: int) -> bytes:
    per_word = 64 // slot
    assert len(pixels) % per_word == 0
    out = bytearray()
    for w in range(len(pixels) // per_word):
        value = 0
        for j in range(per_word):
            p = pixels[w * per_word + j]
            assert 0 <= p < (1 << slot)
            value |= p << (j * slot)
        out += value.to_bytes(8, "big")
    return bytes(out)


def encode_raw_frame(frame: np.ndarray, counter_depth: int) -> bytes:
    """The raw bytes of one frame (row-major pixels) at a counter depth."""
    pixels = [int(v) for v in np.asarray(frame).ravel()]
    slot = SLOT_BITS[counter_depth]
    if counter_depth == 24:
        return _words([p >> 12 for p in pixels], slot) + _words([p & 0xFFF for p in pixels], slot)
    return _words(pixels, slot)


def write_raw_mib(
    path: Path, frames: np.ndarray, *, counter_depth: int, extended: bool = True
) -> Path:
    """Write ``(n, k_r, k_c)`` frames as a single-chip raw-mode ``.mib`` file."""
    frames = np.asarray(frames)
    n, kr, kc = frames.shape
    width = 2 * kc if counter_depth == 24 else kc
    with open(path, "wb") as f:
        for i in range(n):
            f.write(
                raw_header(
                    i + 1,
                    width=width,
                    height=kr,
                    counter_depth=counter_depth,
                    extended=extended,
                )
            )
            f.write(encode_raw_frame(frames[i], counter_depth))
    return path


def write_raw_quad_mib(path: Path, frames: np.ndarray, *, counter_depth: int) -> Path:
    """Write ``(n, 2 s, 2 s)`` frames as a raw-mode 2x2 quad ``.mib`` file (768-byte headers)."""
    frames = np.asarray(frames)
    n, h, w = frames.shape
    assert h == w and h % 2 == 0 and counter_depth != 24
    s = h // 2
    with open(path, "wb") as f:
        for i in range(n):
            fr = frames[i]
            raw_rows = []
            for j in range(s):
                bottom = fr[2 * s - 1 - j]
                raw_rows += [bottom[s:][::-1], bottom[:s][::-1], fr[j, s:], fr[j, :s]]
            stream = np.concatenate(raw_rows)
            f.write(
                raw_header(
                    i + 1, width=4 * s, height=s, counter_depth=counter_depth, size=768, n_chips=4
                )
            )
            f.write(encode_raw_frame(stream, counter_depth))
    return path
