"""Write TVIPS recorder streams (``name_000.tvips``, ``name_001.tvips``...) from the layout.

Independent of the reader: the 256-byte general header and the 60-byte
version 2 frame header are NumPy structured records built field by field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["TVIPS_FRAME_HEADER", "TVIPS_GENERAL_HEADER", "write_tvips"]

TVIPS_GENERAL_HEADER = np.dtype(
    [
        (name, "<u4")
        for name in (
            "size",
            "version",
            "dimx",
            "dimy",
            "bitsperpixel",
            "offsetx",
            "offsety",
            "binx",
            "biny",
            "pixelsize",
            "ht",
            "magtotal",
            "frameheaderbytes",
        )
    ]
    + [("dummy", "S204")]
)
TVIPS_FRAME_HEADER = np.dtype(
    [
        ("num", "<u4"),
        ("timestamp", "<u4"),
        ("ms", "<u4"),
        ("LUTidx", "<u4"),
        ("fcurrent", "<f4"),
        ("mag", "<u4"),
        ("mode", "<u4"),
        ("stagex", "<f4"),
        ("stagey", "<f4"),
        ("stagez", "<f4"),
        ("stagea", "<f4"),
        ("stageb", "<f4"),
        ("rotidx", "<u4"),
        ("temperature", "<f4"),
        ("objective", "<f4"),
    ]
)


def write_tvips(
    directory: Path,
    name: str,
    frames: np.ndarray,
    *,
    frames_per_file: int = 1000,
    version: int = 2,
    extra_frame_header: int = 0,
    ht_kv: int = 300,
    rotidx: np.ndarray | None = None,
    header_overrides: dict[str, int] | None = None,
    truncate_last_by: int = 0,
) -> Path:
    """Write ``(n, k_r, k_c)`` unsigned frames over files of ``frames_per_file`` frames.

    ``rotidx`` gives each frame's rotator index (default 1..n).  Returns the
    ``_000`` file.
    """
    frames = np.asarray(frames)
    n, kr, kc = frames.shape
    fh_bytes = 12 if version == 1 else TVIPS_FRAME_HEADER.itemsize + extra_frame_header
    h = np.zeros((), TVIPS_GENERAL_HEADER)
    h["size"] = 256
    h["version"] = version
    h["dimx"] = kc
    h["dimy"] = kr
    h["bitsperpixel"] = frames.dtype.itemsize * 8
    h["binx"] = h["biny"] = 1
    h["pixelsize"] = 3
    h["ht"] = ht_kv
    h["magtotal"] = 800
    h["frameheaderbytes"] = fh_bytes
    h["dummy"] = b"TVIPS " * 34
    for key, value in (header_overrides or {}).items():
        h[key] = value
    heads = np.zeros(n, TVIPS_FRAME_HEADER)
    heads["num"] = np.arange(n) % 4096
    heads["timestamp"] = 1700000000 + np.arange(n) // 100
    heads["ms"] = (np.arange(n) * 10) % 1000
    heads["mode"] = 2
    heads["rotidx"] = np.arange(1, n + 1) if rotidx is None else rotidx
    pixels = frames.astype(frames.dtype.newbyteorder("<"))
    paths = []
    for part, i in enumerate(range(0, n, frames_per_file)):
        out = bytearray(h.tobytes() if part == 0 else b"")
        for k in range(i, min(n, i + frames_per_file)):
            head = heads[k].tobytes()
            if version == 1:
                head = head[:12]
            out += head + bytes(extra_frame_header if version == 2 else 0)
            out += pixels[k].tobytes()
        p = directory / f"{name}_{part:03d}.tvips"
        p.write_bytes(bytes(out))
        paths.append(p)
    if truncate_last_by:
        last = paths[-1]
        last.write_bytes(last.read_bytes()[:-truncate_last_by])
    return paths[0]
