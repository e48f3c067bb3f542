"""Write NanoMEGAS blockfiles (``.blo``) from the documented byte layout.

Independent of the reader: the header is a NumPy structured record laid out
field by field as the ASTAR format is documented (quantem_flow.io.blockfile
docstring, RosettaSciIO's description).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["BLO_HEADER_DTYPE", "write_blockfile"]

BLO_HEADER_DTYPE = np.dtype(
    [
        ("ID", "S6"),
        ("MAGIC", "<u2"),
        ("Data_offset_1", "<u4"),
        ("Data_offset_2", "<u4"),
        ("UNKNOWN1", "<u4"),
        ("DP_SZ", "<u2"),
        ("DP_rotation", "<u2"),
        ("NX", "<u2"),
        ("NY", "<u2"),
        ("Scan_rotation", "<u2"),
        ("SX", "<f8"),
        ("SY", "<f8"),
        ("Beam_energy", "<u4"),
        ("SDP", "<u2"),
        ("Camera_length", "<u4"),
        ("Acquisition_time", "<f8"),
        ("Centering", "<f8", (8,)),
        ("Distortion", "<f8", (14,)),
    ]
)
assert BLO_HEADER_DTYPE.itemsize == 240


def write_blockfile(
    path: Path,
    data: np.ndarray,
    *,
    step_nm: tuple[float, float] = (2.5, 1.5),
    beam_energy_v: int = 200000,
    note: str = "quantem-flow test",
    header_overrides: dict[str, object] | None = None,
    truncate_by: int = 0,
) -> Path:
    """Write a ``(NY, NX, k, k)`` u8 array as a blockfile.

    ``step_nm`` is (row step SY, column step SX).  ``header_overrides``
    replaces header fields after the layout is computed (a lying header);
    ``truncate_by`` drops that many bytes from the end.
    """
    data = np.asarray(data, dtype=np.uint8)
    ny, nx, k, k2 = data.shape
    assert k == k2, "blockfile frames are square"
    off1 = 0x1000
    off2 = off1 + nx * ny
    off2 += off2 % 16  # as the ASTAR software pads it
    h = np.zeros((), dtype=BLO_HEADER_DTYPE)
    h["ID"] = b"IMGBLO"
    h["MAGIC"] = 0x0102
    h["Data_offset_1"] = off1
    h["Data_offset_2"] = off2
    h["UNKNOWN1"] = 131141
    h["DP_SZ"] = k
    h["NX"] = nx
    h["NY"] = ny
    h["Scan_rotation"] = 1250
    h["SX"] = step_nm[1]
    h["SY"] = step_nm[0]
    h["Beam_energy"] = beam_energy_v
    h["SDP"] = 500
    h["Camera_length"] = 1000
    h["Acquisition_time"] = 45000.5
    for key, value in (header_overrides or {}).items():
        h[key] = value
    records = np.zeros(ny * nx, dtype=[("magic", "<u2"), ("num", "<u4"), ("img", "u1", (k, k))])
    records["magic"] = 0x55AA
    records["num"] = np.arange(ny * nx)
    records["img"] = data.reshape(-1, k, k)
    buf = bytearray(off2)
    buf[:240] = h.tobytes()
    nb = note.encode("latin-1")[: off1 - 240]
    buf[240 : 240 + len(nb)] = nb
    vbf = data.reshape(ny, nx, -1).mean(axis=2).astype(np.uint8)
    buf[off1 : off1 + nx * ny] = vbf.tobytes()
    payload = bytes(buf) + records.tobytes()
    if truncate_by:
        payload = payload[:-truncate_by]
    path.write_bytes(payload)
    return path
