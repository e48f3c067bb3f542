"""Write MRC2014 stacks (and a Direct Electron ``_info.txt``) from the documented layout.

Independent of the reader: the 1024-byte header is built word by word as
MRC2014 lays it out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["MRC_MODE_OF", "write_de_info", "write_mrc"]

MRC_MODE_OF = {"i1": 0, "u1": 0, "i2": 1, "f4": 2, "u2": 6, "f2": 12}


def write_mrc(
    path: Path,
    frames: np.ndarray,
    *,
    big_endian: bool = False,
    extended: bytes = b"",
    exttyp: bytes = b"FEI1",
    imod_unsigned: bool = False,
    map_word: bool = True,
    header_overrides: dict[str, int] | None = None,
    truncate_by: int = 0,
    trailing: bytes = b"",
) -> Path:
    """Write ``(n, k_r, k_c)`` frames as an MRC stack (NX = k_c, NY = k_r, NZ = n)."""
    frames = np.asarray(frames)
    n, kr, kc = frames.shape
    e = ">" if big_endian else "<"
    words = np.zeros(256, dtype=e + "i4")
    header = bytearray(1024)
    fields = {
        "NX": (0, kc),
        "NY": (4, kr),
        "NZ": (8, n),
        "MODE": (12, MRC_MODE_OF[frames.dtype.str[1:]]),
        "MX": (28, kc),
        "MY": (32, kr),
        "MZ": (36, n),
        "MAPC": (64, 1),
        "MAPR": (68, 2),
        "MAPS": (72, 3),
        "NSYMBT": (92, len(extended)),
        "NVERSION": (108, 20140),
        "NLABL": (220, 1),
    }
    if imod_unsigned:
        fields["IMODSTAMP"] = (152, 1146047817)
        fields["IMODFLAGS"] = (156, 0)
    for key, value in (header_overrides or {}).items():
        fields[key] = (fields[key][0], value)
    for off, value in fields.values():
        words[off // 4] = value
    header[:] = words.tobytes()
    header[40:52] = np.array([kc * 1.5, kr * 1.5, n * 1.0], e + "f4").tobytes()
    header[104:108] = exttyp
    if map_word:
        header[208:212] = b"MAP "
    header[212:214] = b"\x11\x11" if big_endian else b"\x44\x44"
    label = b"quantem-flow test stack"
    header[224 : 224 + len(label)] = label
    body = np.ascontiguousarray(frames.astype(frames.dtype.newbyteorder(e))).tobytes()
    out = bytes(header) + extended + body + trailing
    if truncate_by:
        out = out[:-truncate_by]
    path.write_bytes(out)
    return path


def write_de_info(
    path: Path,
    scan_shape: tuple[int, int],
    *,
    step_nm: tuple[float, float] | None = (0.8, 0.4),
    scan_type: str = "Raster",
) -> Path:
    """Write a DE ``*_info.txt``: scan size and specimen pixel size (row, column step)."""
    lines = [
        "Camera Model = DE-16",
        "Scan - Enable = Enable",
        f"Scan - Type = {scan_type}",
        f"Scan - Size X = {scan_shape[1]}",
        f"Scan - Size Y = {scan_shape[0]}",
        "Diffraction Pixel Size X = 0.01",
        "Frames Per Second = 1000",
    ]
    if step_nm is not None:
        lines += [
            f"Specimen Pixel Size X (nanometers) = {step_nm[1]}",
            f"Specimen Pixel Size Y (nanometers) = {step_nm[0]}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path
