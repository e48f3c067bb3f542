"""An independent writer of PNDetector FRMS6 acquisitions (from the documented layout).

Writes ``name.hdr`` (INI ``[measurementInfo]``) and ``name_000.frms6`` (dark
frames), ``name_001.frms6``... (signal frames split over files), each with
the 1024-byte file header and a 64-byte header per frame, the frames folded
as the camera reads them out (left half: the top rows; right half: the bottom
rows upside down and mirrored), with NumPy and ``struct`` alone.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


def fold(frames: np.ndarray) -> np.ndarray:
    """``(n, 2h, w)`` detector frames to ``(n, h, 2w)`` as read out."""
    n, rows, cols = frames.shape
    h = rows // 2
    out = np.empty((n, h, 2 * cols), dtype=frames.dtype)
    out[:, :, :cols] = frames[:, :h]
    out[:, :, cols:] = frames[:, h:][:, ::-1, ::-1]
    return out


def _file(path: Path, stored: np.ndarray, *, count_in_header: bool = True) -> None:
    n, h, w = stored.shape
    header = bytearray(1024)
    struct.pack_into("<HH", header, 0, 1024, 64)
    header[7] = 6
    struct.pack_into("<HH", header, 88, w, h)
    struct.pack_into("<I", header, 1020, n if count_in_header else 0)
    with open(path, "wb") as f:
        f.write(bytes(header))
        for i, frame in enumerate(stored):
            fh = bytearray(64)
            struct.pack_into("<III", fh, 4, 1_700_000_000, i * 10, i)
            f.write(bytes(fh) + np.ascontiguousarray(frame, dtype="<u2").tobytes())


def write_frms6(
    folder: Path,
    frames: np.ndarray,
    darks: np.ndarray,
    *,
    stem_image_size: tuple[int, int] | None,
    name: str = "acq",
    per_file: int = 10,
    binning: int = 1,
    count_in_header: bool = True,
) -> Path:
    """Write the acquisition; ``frames``/``darks`` are ``(n, 2h, w)`` uint16. Returns the .hdr."""
    _file(folder / f"{name}_000.frms6", fold(darks), count_in_header=count_in_header)
    stored = fold(frames)
    for k, a in enumerate(range(0, len(stored), per_file), start=1):
        _file(
            folder / f"{name}_{k:03d}.frms6",
            stored[a : a + per_file],
            count_in_header=count_in_header,
        )
    lines = [
        "[measurementInfo]",
        f"darkframes={len(darks)}",
        f"signalframes={len(frames)}",
        "dwelltimemicroseconds=250",
        "gain=3",
        f'readoutmode="bin: {binning}, windowing: 264 x 264"',
    ]
    if stem_image_size is not None:
        lines.append(f"stemimagesize={stem_image_size[0]}x{stem_image_size[1]}")
    hdr = folder / f"{name}.hdr"
    hdr.write_text("\n".join(lines) + "\n")
    return hdr
