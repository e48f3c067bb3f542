"""Write TIA ``.ser`` series (and an ``.emi`` beside them) from the documented layout.

Independent of the reader: every field is packed here from the TIA "Series
Data File" description (header, dimension records, offset arrays, 2-D data
elements with rows stored bottom to top, time+position tags).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["SER_TYPE_CODES", "write_emi", "write_ser"]

SER_TYPE_CODES = {"u1": 1, "u2": 2, "u4": 3, "i1": 4, "i2": 5, "i4": 6, "f4": 7, "f8": 8}


def _dim(size: int, offset: float, delta: float, desc: str, units: str) -> bytes:
    d = desc.encode()
    u = units.encode()
    return (
        np.array([size], "<u4").tobytes()
        + np.array([offset, delta], "<f8").tobytes()
        + np.array([0, len(d)], "<u4").tobytes()
        + d
        + np.array([len(u)], "<u4").tobytes()
        + u
    )


def write_ser(
    path: Path,
    data: np.ndarray,
    *,
    version: int = 0x0220,
    ndim: int = 2,
    step_m: tuple[float, float] = (2e-10, 5e-10),
    units: str = "meters",
    positions: bool = True,
    column_major: bool = False,
    valid: int | None = None,
    element_overrides: dict[str, int] | None = None,
    header_overrides: dict[str, int] | None = None,
    truncate_by: int = 0,
) -> Path:
    """Write a ``(R, C, k_r, k_c)`` array as a TIA series of 2-D elements.

    ``step_m`` is (row step, column step) in metres.  ``ndim=1`` writes one
    dimension of ``R * C`` elements.  ``valid`` < ``R * C`` writes only the
    first ``valid`` elements (an aborted acquisition).  ``column_major``
    stores the scan column by column, with matching position tags.
    """
    data = np.asarray(data)
    R, C, kr, kc = data.shape
    code = SER_TYPE_CODES[data.dtype.str[1:]]
    total = R * C
    nvalid = total if valid is None else valid
    wide = version >= 0x0220
    isz = 8 if wide else 4
    frames = (
        data.transpose(1, 0, 2, 3).reshape(-1, kr, kc) if column_major else data.reshape(-1, kr, kc)
    )
    head = np.array([0x4949, 0x0197, version], "<u2").tobytes()
    head += np.array([0x4122, 0x4142 if positions else 0x4152, total, nvalid], "<u4").tobytes()
    dims = (
        _dim(C, 0.0, step_m[1], "X", units) + _dim(R, 0.0, step_m[0], "Y", units)
        if ndim == 2
        else _dim(total, 0.0, 1.0, "Number", "")
    )
    fixed = len(head) + isz + 4
    array_offset = fixed + len(dims)
    data_start = array_offset + 2 * total * isz
    elem_bytes = 50 + kr * kc * data.dtype.itemsize
    tag_bytes = 24 if positions else 8
    data_offsets = np.zeros(total, np.int64)
    tag_offsets = np.zeros(total, np.int64)
    data_offsets[:nvalid] = data_start + np.arange(nvalid) * elem_bytes
    tag_start = data_start + nvalid * elem_bytes
    tag_offsets[:nvalid] = tag_start + np.arange(nvalid) * tag_bytes
    out = bytearray(head)
    out += np.array([array_offset], "<u8" if wide else "<u4").tobytes()
    out += np.array([ndim], "<u4").tobytes()
    out += dims
    out += np.concatenate([data_offsets, tag_offsets]).astype("<u8" if wide else "<u4").tobytes()
    eh = {
        "cal_x": (0.0, 1e7, 0),
        "cal_y": (0.0, 1e7, 0),
        "DataType": code,
        "ArraySizeX": kc,
        "ArraySizeY": kr,
    }
    eh.update(element_overrides or {})
    for i in range(nvalid):
        out += np.array([eh["cal_x"][0], eh["cal_x"][1]], "<f8").tobytes()
        out += np.array([eh["cal_x"][2]], "<u4").tobytes()
        out += np.array([eh["cal_y"][0], eh["cal_y"][1]], "<f8").tobytes()
        out += np.array([eh["cal_y"][2]], "<u4").tobytes()
        out += np.array([eh["DataType"]], "<u2").tobytes()
        out += np.array([eh["ArraySizeX"], eh["ArraySizeY"]], "<u4").tobytes()
        # TIA's origin is the lower-left corner: the bottom row is stored first.
        out += np.ascontiguousarray(frames[i][::-1]).astype(data.dtype.newbyteorder("<")).tobytes()
    for i in range(nvalid):
        r, c = (i % R, i // R) if column_major else divmod(i, C)
        out += np.array([0x4142 if positions else 0x4152, 0], "<u2").tobytes()
        out += np.array([1700000000 + i], "<u4").tobytes()
        if positions:
            out += np.array([c * step_m[1], r * step_m[0]], "<f8").tobytes()
    for key, value in (header_overrides or {}).items():
        at = {"TotalNumberElements": 14, "ValidNumberElements": 18, "DataTypeID": 6}[key]
        out[at : at + 4] = np.array([value], "<u4").tobytes()
    if truncate_by:
        out = out[:-truncate_by]
    path.write_bytes(bytes(out))
    return path


def write_emi(path: Path, *, high_tension_kv: float = 300.0) -> Path:
    """Write a minimal ``.emi`` file: binary padding around one ``<ObjectInfo>`` XML block."""
    xml = (
        "<ObjectInfo><AcquireDate>Mon Jan 01 12:00:00 2024</AcquireDate>"
        "<ExperimentalDescription><Root>"
        f"<Data><Label>High tension</Label><Value>{high_tension_kv}</Value><Unit>kV</Unit></Data>"
        "<Data><Label>Mode</Label><Value>STEM nP SA Zoom Diffraction</Value><Unit></Unit></Data>"
        "</Root></ExperimentalDescription>"
        "<AcquireInfo><CameraNamePath>BM-Ceta</CameraNamePath></AcquireInfo></ObjectInfo>"
    )
    path.write_bytes(b"\x00\x01\x02binary" * 7 + xml.encode() + b"\x00" * 33)
    return path
