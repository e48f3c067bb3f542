"""Gatan ``.dm4`` files written from the documented tag layout.

Independent of :mod:`quantem_flow.io.dm4`.  A DM4 file: a 16-byte header
(version 4, root group length and byte-order flag, all big-endian), then the
root tag group.  Every tag is its kind (20 group, 21 data), its name (length
as a big-endian uint16), the size of the rest of the tag (big-endian
uint64) and then, for a group, the sorted/open bytes, the tag count
(big-endian uint64) and the tags; for data, ``%%%%``, the length of the type
description and the description (big-endian uint64s) and the values in the
header's byte order (little-endian here).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DM_TYPE", "dm3_bytes", "dm4_bytes", "write_dm4_4d"]

#: NumPy dtype -> DM tag type code.
DM_TYPE = {
    np.dtype("<i2"): 2,
    np.dtype("<i4"): 3,
    np.dtype("<u2"): 4,
    np.dtype("<u4"): 5,
    np.dtype("<f4"): 6,
    np.dtype("<f8"): 7,
    np.dtype("bool"): 8,
    np.dtype("i1"): 9,
    np.dtype("u1"): 10,
    np.dtype("<i8"): 11,
    np.dtype("<u8"): 12,
}
#: NumPy dtype -> ImageData/DataType code.
IMAGE_TYPE = {
    np.dtype("<i2"): 1,
    np.dtype("<f4"): 2,
    np.dtype("u1"): 6,
    np.dtype("<i4"): 7,
    np.dtype("i1"): 9,
    np.dtype("<u2"): 10,
    np.dtype("<u4"): 11,
    np.dtype("<f8"): 12,
}


class Array:
    """A tag holding an array (of simple values)."""

    def __init__(self, values: np.ndarray):
        self.values = np.ascontiguousarray(values)


def text(s: str) -> Array:
    """A DM text tag: an array of UTF-16 code units."""
    return Array(np.array([ord(c) for c in s], dtype="<u2"))


_ORDER = ["<"]  # byte order of tag values while a file is built
_DM3 = [False]  # DM3: uint32 counts and type descriptions, no tag sizes


def _info_and_bytes(value: Any) -> tuple[list[int], bytes]:
    o = _ORDER[0]
    if isinstance(value, Array):
        a = value.values
        key = a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else a.dtype
        dt = a.dtype.newbyteorder(o) if a.dtype.itemsize > 1 else a.dtype
        return [20, DM_TYPE[key], a.size], a.astype(dt).tobytes()
    if isinstance(value, bool):
        return [8], struct.pack(o + "?", value)
    if isinstance(value, int):
        return [5], struct.pack(o + "I", value)
    if isinstance(value, float):
        return [7], struct.pack(o + "d", value)
    if isinstance(value, np.generic):
        key = value.dtype.newbyteorder("<") if value.dtype.itemsize > 1 else value.dtype
        dt = value.dtype.newbyteorder(o) if value.dtype.itemsize > 1 else value.dtype
        return [DM_TYPE[key]], np.asarray(value).astype(dt).tobytes()  # scalars: native
    raise TypeError(type(value))


def _tag(name: str, value: Any) -> bytes:
    label = name.encode("latin-1")
    if isinstance(value, (dict, list)):
        body = _group(value)
        kind = 20
    else:
        info, payload = _info_and_bytes(value)
        w = "I" if _DM3[0] else "Q"
        body = b"%%%%" + struct.pack(">" + w, len(info)) + struct.pack(f">{len(info)}{w}", *info)
        body += payload
        kind = 21
    size = b"" if _DM3[0] else struct.pack(">Q", len(body))
    return struct.pack(">BH", kind, len(label)) + label + size + body


def _group(tags: dict[str, Any] | list[Any]) -> bytes:
    items = list(tags.items()) if isinstance(tags, dict) else [("", v) for v in tags]
    out = struct.pack(">BBI" if _DM3[0] else ">BBQ", 0, 1, len(items))
    for name, value in items:
        out += _tag(name, value)
    return out


def dm4_bytes(root: dict[str, Any], *, big_endian: bool = False) -> bytes:
    """The bytes of a DM4 file holding ``root`` (dicts are named groups, lists unnamed).

    ``big_endian`` writes the tag values big-endian (byte-order flag 0).
    """
    _ORDER[0] = ">" if big_endian else "<"
    try:
        body = _group(root)
    finally:
        _ORDER[0] = "<"
    return struct.pack(">IQI", 4, len(body) + 8, 0 if big_endian else 1) + body + bytes(8)


def dm3_bytes(root: dict[str, Any]) -> bytes:
    """The bytes of a DM3 tag file holding ``root`` (little-endian values).

    DM3: a 12-byte header (version 3, root length, byte-order flag: big-endian
    uint32s), tag counts and type descriptions as big-endian uint32s, and no
    size field in the tags.
    """
    _DM3[0] = True
    try:
        body = _group(root)
    finally:
        _DM3[0] = False
    return struct.pack(">III", 3, len(body), 1) + body + bytes(8)


def write_dm4_4d(
    path: Path,
    data: np.ndarray,
    *,
    swapped: bool | None = True,
    scan_calibration: tuple[float, float, str] | None = (0.5, 0.25, "nm"),
    detector_calibration: tuple[float, float, str] | None = (0.02, 0.03, "1/nm"),
    detector_origin: tuple[float, float] = (3.0, 4.5),
    voltage_V: float | None = 300000.0,
    dimensions: list[int] | None = None,
    data_type: int | None = None,
    big_endian: bool = False,
    extra_4d: bool = False,
) -> Path:
    """Write a 4-D ``(R_r, R_c, k_r, k_c)`` array as a GMS-style DM4 file.

    ``swapped=True`` stores it in C order with ``Data Order Swapped = 1`` and
    ``Dimensions = (k_c, k_r, R_c, R_r)``; ``False`` (tag 0) or ``None`` (no
    tag) in the hybrid order: ``Dimensions = (R_c, R_r, k_c, k_r)``, one scan
    image per detector pixel.  Calibrations are ``(row, col, units)``.
    ``dimensions`` and ``data_type`` override what is written (lying headers).
    ``big_endian`` writes byte-order flag 0 and big-endian values;
    ``extra_4d`` appends a second (all-zero) 4-D image to the ImageList.
    """
    data = np.asarray(data)
    R, C, kr, kc = data.shape
    dt = data.dtype.newbyteorder("<") if data.dtype.itemsize > 1 else data.dtype
    if swapped:
        stored = np.ascontiguousarray(data, dtype=dt)
        dims = [kc, kr, C, R]
    else:
        stored = np.ascontiguousarray(data.transpose(2, 3, 0, 1), dtype=dt)
        dims = [C, R, kc, kr]

    def axis(scale: float, origin: float, units: str) -> dict[str, Any]:
        return {"Origin": np.float32(origin), "Scale": np.float32(scale), "Units": text(units)}

    s_cal = scan_calibration or (1.0, 1.0, "")
    d_cal = detector_calibration or (1.0, 1.0, "")
    scan_axes = {"row": axis(s_cal[0], 0.0, s_cal[2]), "col": axis(s_cal[1], 0.0, s_cal[2])}
    det_axes = {
        "row": axis(d_cal[0], detector_origin[0], d_cal[2]),
        "col": axis(d_cal[1], detector_origin[1], d_cal[2]),
    }
    if swapped:
        cal_dims = [det_axes["col"], det_axes["row"], scan_axes["col"], scan_axes["row"]]
    else:
        cal_dims = [scan_axes["col"], scan_axes["row"], det_axes["col"], det_axes["row"]]
    meta: dict[str, Any] = {"Format": text("Diffraction image")}
    if swapped is not None:
        meta["Data Order Swapped"] = bool(swapped)
    image_tags: dict[str, Any] = {"Meta Data": meta}
    if voltage_V is not None:
        image_tags["Microscope Info"] = {"Voltage": float(voltage_V), "Name": text("TEM")}
    thumb = {
        "ImageData": {
            "Data": Array(np.zeros(64 * 64, dtype="u1")),
            "DataType": 6,
            "Dimensions": [64, 64],
            "PixelDepth": 1,
        },
        "ImageTags": {},
        "Name": text("thumbnail"),
    }
    image = {
        "ImageData": {
            "Calibrations": {
                "Brightness": {"Origin": np.float32(0), "Scale": np.float32(1), "Units": text("")},
                "Dimension": cal_dims,
                "DisplayCalibratedUnits": True,
            },
            "Data": Array(stored.reshape(-1)),
            "DataType": IMAGE_TYPE[dt] if data_type is None else data_type,
            "Dimensions": dimensions if dimensions is not None else dims,
            "PixelDepth": dt.itemsize,
        },
        "ImageTags": image_tags,  # after the data, as GMS writes it
        "Name": text("4D STEM"),
        "UniqueID": {"[0]": 1, "[1]": 2},
    }
    images = [thumb, image]
    if extra_4d:
        other = dict(image)
        other["ImageData"] = dict(image["ImageData"], Data=Array(np.zeros_like(stored).reshape(-1)))
        images.append(other)
    root = {
        "ApplicationBounds": Array(np.array([0, 0, 100, 100], dtype="<i4")),
        "ImageList": images,
        "InImageMode": True,
    }
    path.write_bytes(dm4_bytes(root, big_endian=big_endian))
    return path
