"""An independent writer of Gatan K2 IS sector files (from the documented block layout).

Eight files ``name_1.bin``... ``name_8.bin`` of blocks: a 40-byte big-endian
header (sync 0xFFFF0055, block count, sector width and height, frame id, the
block's inclusive pixel ranges within its sector) and the block's pixels packed
12 bits each.  Blocks go right to left, top to bottom within a sector, as the
camera writes them.  ``lead`` gives each sector some blocks of an earlier,
partial frame first (recording starts mid-frame), ``tail`` a partial last frame.
The camera's geometry is sectors of 1860 x 256 in blocks of 930 x 16; smaller
ones (read from the headers by the reader) keep the tests small.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from .writers_dm4 import dm3_bytes, dm4_bytes

SYNC = 0xFFFF0055


def pack12(values: np.ndarray) -> bytes:
    """Pixels (< 4096) two by two into three bytes: a | (b & 15) << 12 | (b >> 4) << 16."""
    v = values.astype(np.uint32).reshape(-1, 2)
    a, b = v[:, 0], v[:, 1]
    out = np.stack([a & 0xFF, (a >> 8) | ((b & 0x0F) << 4), b >> 4], axis=1)
    return out.astype(np.uint8).tobytes()


def write_k2is(
    folder: Path,
    frames: np.ndarray,
    *,
    block: tuple[int, int],
    name: str = "capture",
    first_id: int = 41,
    lead: tuple[int, ...] = (0, 3, 1, 0, 2, 0, 5, 1),
    tail: int = 2,
    gtg: bool = True,
    si_dimensions: tuple[int, int] | None = None,
    shutter_from: int = 0,
    shutter_until: int | None = None,
    gtg_version: int = 4,
) -> Path:
    """Write ``frames`` (``(n, H, 8 * W)`` uint16 < 4096); return the ``.gtg`` (or sector 1).

    Blocks of frames ``shutter_from`` on (and the partial frame after them), up to
    ``shutter_until`` (exclusive) when given, have the shutter-active flag (bit 0
    of byte 9) set.  The ``.gtg`` is a DM tag
    file (``gtg_version`` 3 or 4) holding ``SI Dimensions`` (``Size Y`` rows,
    ``Size X`` columns) when ``si_dimensions`` is given.
    """
    n, sh, width = frames.shape
    sw = width // 8
    bh, bw = block
    assert sh % bh == 0 and sw % bw == 0 and frames.max() < 4096
    order = [(y, x) for y in range(0, sh, bh) for x in range(sw - bw, -1, -bw)]
    for s in range(8):
        count = 0
        with open(folder / f"{name}_{s + 1}.bin", "wb") as f:

            def put(fid: int, y: int, x: int, pixels: np.ndarray) -> None:
                nonlocal count
                head = bytearray(40)
                struct.pack_into(">I", head, 0, SYNC)
                head[8] = 2
                open_ = fid >= first_id + shutter_from
                if shutter_until is not None:
                    open_ = open_ and fid < first_id + shutter_until
                head[9] = 1 if open_ else 0
                struct.pack_into(">IHHI", head, 16, count, sw, sh, fid)
                struct.pack_into(">HHHH", head, 28, x, y, x + bw - 1, y + bh - 1)
                struct.pack_into(">I", head, 36, 3 * bw * bh // 2 + 40)
                f.write(bytes(head) + pack12(pixels))
                count += 1

            sector = frames[:, :, s * sw : (s + 1) * sw]
            partial = min(lead[s], len(order) - 1)  # a partial frame: fewer blocks than a frame
            for y, x in order[len(order) - partial :] if partial else []:
                put(first_id - 1, y, x, np.full((bh, bw), 7, np.uint16))
            for i in range(n):
                for y, x in order:
                    put(first_id + i, y, x, sector[i, y : y + bh, x : x + bw])
            for y, x in order[: min(tail, len(order) - 1)]:  # a frame never finished
                put(first_id + n, y, x, np.full((bh, bw), 9, np.uint16))
    if gtg:
        root: dict[str, object] = {"Acquisition": {"Frame Rate (fps)": 400.0}}
        if si_dimensions is not None:
            root["SI Dimensions"] = {"Size X": si_dimensions[1], "Size Y": si_dimensions[0]}
        path = folder / f"{name}.gtg"
        path.write_bytes(dm3_bytes(root) if gtg_version == 3 else dm4_bytes(root))
        return path
    return folder / f"{name}_1.bin"
