"""FEI/Thermo Fisher TIA series files (``.ser``, with the ``.emi`` beside them).

The layout follows the TIA "Series Data File" description (Emispec ES
Vision 3.x, published by C. B. Boothroyd; version ``0x0220`` widens the
offsets to 8 bytes).  All values are little-endian.

Header: ``ByteOrder`` u2 (``0x4949``), ``SeriesID`` u2 (``0x0197``),
``SeriesVersion`` u2 (``0x0210`` or ``0x0220``), ``DataTypeID`` u4
(``0x4120`` 1-D elements, ``0x4122`` 2-D elements), ``TagTypeID`` u4
(``0x4152`` time, ``0x4142`` time and position), ``TotalNumberElements``
u4, ``ValidNumberElements`` u4, ``OffsetArrayOffset`` (u4, or u8 from
version ``0x0220``), ``NumberDimensions`` u4, then one dimension record per
scan dimension: ``DimensionSize`` u4, ``CalibrationOffset`` f8,
``CalibrationDelta`` f8, ``CalibrationElement`` u4, ``DescriptionLength``
u4 + text, ``UnitsLength`` u4 + text.  At ``OffsetArrayOffset``: the data
offset array (one u4/u8 per element) then the tag offset array.

A 2-D data element is ``CalibrationOffsetX`` f8, ``CalibrationDeltaX`` f8,
``CalibrationElementX`` u4, the same three for Y, ``DataType`` u2 (1 u1,
2 u2, 3 u4, 4 i1, 5 i2, 6 i4, 7 f4, 8 f8; 9/10 complex), ``ArraySizeX`` u4,
``ArraySizeY`` u4 (50 bytes), then the pixels with X (columns) fastest.
A tag is ``TagTypeID`` u2, two unused bytes, ``Time`` u4 and, for
``0x4142``, ``PositionX`` f8 and ``PositionY`` f8 (metres).

Choices of this reader (recorded in provenance where they shape the data):

* **Row order.**  TIA stores each image's rows bottom to top (its origin is
  the lower-left corner); the reader reverses them so that row 0 is the top
  row as TIA displays it (the same choice as HyperSpy/RosettaSciIO).  A
  note says so on every open.
* **Scan.**  Dimension 1 is the fast scan axis (columns, X) and dimension 2
  the slow one (rows, Y).  When position tags are present the reader checks
  that X changes first; a file whose Y changes first (column-major order)
  is refused rather than transposed silently.  A 1-D series (or a 2-D file
  whose acquisition stopped early, ``ValidNumberElements <
  TotalNumberElements``) needs ``scan_shape`` (or a sidecar).
* **Calibration.**  The scan step comes from the dimension records when
  their unit is metres.  The data elements' own calibration (the detector
  pixel size) carries no unit in the ``.ser`` file, so the detector is
  left in pixels; those values are reported in :attr:`~SerSource.metadata`.
  The accelerating voltage comes from the ``.emi`` file's
  ``ExperimentalDescription`` (``High tension`` in kV) when it is there.
* The ``.emi`` file is read only for its XML ``<ObjectInfo>`` blocks; its
  binary layout is undocumented.  Elements of differing sizes are refused.
"""

from __future__ import annotations

import math
import os
import re
import struct
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import DtypeError, FormatError, ScanShapeError, ShapeError
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile
from .records import read_records_into

__all__ = ["SER_DTYPES", "SerSource", "parse_emi", "parse_ser_header", "sniff"]

#: Data element ``DataType`` -> stored dtype.
SER_DTYPES: dict[int, str] = {
    1: "<u1",
    2: "<u2",
    3: "<u4",
    4: "<i1",
    5: "<i2",
    6: "<i4",
    7: "<f4",
    8: "<f8",
}
_ELEMENT_2D = 0x4122
_ELEMENT_1D = 0x4120
_TAG_POSITION = 0x4142
_ELEMENT_HEADER = struct.Struct("<ddIddIHII")  # 50 bytes
_MAX_METADATA_ENTRIES = 300


def sniff(path: Path, head: bytes) -> bool:
    """TIA series: ``II`` byte order, series ID ``0x0197`` and version 0x0210/0x0220."""
    if len(head) < 6:
        return False
    order, sid, version = struct.unpack_from("<HHH", head, 0)
    return order == 0x4949 and sid == 0x0197 and version in (0x0210, 0x0220)


def parse_ser_header(raw: bytes, path: Path) -> dict[str, Any]:
    """Parse the header and dimension records of a ``.ser`` file.

    Parameters
    ----------
    raw
        The start of the file (the header and every dimension record).
    path
        The file, for error messages.

    Returns
    -------
    dict
        Header fields by name and ``dimensions``: a list of dicts (``size``,
        ``offset``, ``delta``, ``element``, ``description``, ``units``).

    Raises
    ------
    FormatError
        If the bytes are not a TIA series header or end inside it.
    """
    p = str(path)
    if not sniff(path, raw):
        raise FormatError(
            f"{p!r} does not start with a TIA series header (byte order 0x4949, series ID "
            f"0x0197, version 0x0210 or 0x0220; found {raw[:6]!r}); expected an FEI/Thermo "
            "Fisher TIA .ser file"
        )
    try:
        _order, _sid, version, dtid, tagid, total, valid = struct.unpack_from("<HHHIIII", raw, 0)
        if version >= 0x0220:
            (array_offset,) = struct.unpack_from("<Q", raw, 22)
            (ndim,) = struct.unpack_from("<I", raw, 30)
            pos = 34
        else:
            (array_offset,) = struct.unpack_from("<I", raw, 22)
            (ndim,) = struct.unpack_from("<I", raw, 26)
            pos = 30
        if ndim > 8:
            raise FormatError(
                f"TIA series {p!r}: header field NumberDimensions is {ndim}; expected 0 to 2 "
                "scan dimensions (at most 8). The header is damaged"
            )
        dims = []
        for _ in range(ndim):
            size, offset, delta, element, dlen = struct.unpack_from("<IddII", raw, pos)
            pos += 28
            desc = raw[pos : pos + dlen].decode("latin-1")
            pos += dlen
            (ulen,) = struct.unpack_from("<I", raw, pos)
            pos += 4
            units = raw[pos : pos + ulen].decode("latin-1")
            pos += ulen
            if pos > len(raw):
                raise struct.error("dimension record past the end")
            dims.append(
                {
                    "size": size,
                    "offset": offset,
                    "delta": delta,
                    "element": element,
                    "description": desc,
                    "units": units,
                }
            )
    except struct.error as exc:
        raise FormatError(
            f"TIA series {p!r} ends inside its header or dimension records ({len(raw)} bytes "
            "read); the file is truncated or damaged"
        ) from exc
    return {
        "SeriesVersion": version,
        "DataTypeID": dtid,
        "TagTypeID": tagid,
        "TotalNumberElements": total,
        "ValidNumberElements": valid,
        "OffsetArrayOffset": array_offset,
        "NumberDimensions": ndim,
        "dimensions": dims,
    }


def parse_emi(path: Path, index: int = 0) -> dict[str, str]:
    """Return the flattened ``<ObjectInfo>`` XML block number ``index`` of an ``.emi`` file.

    The ``.emi`` file is binary with XML blocks inside; only those are read.
    ``ExperimentalDescription`` entries (``<Data><Label>..<Value>..<Unit>``)
    become ``"ExperimentalDescription/<Label> [<Unit>]": value``.  An
    unreadable block gives ``{}`` (the metadata is optional).
    """
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    blocks = re.findall(rb"<ObjectInfo>.*?</ObjectInfo>", raw, flags=re.DOTALL)
    if not blocks:
        return {}
    block = blocks[index] if index < len(blocks) else blocks[0]
    try:
        root = ET.fromstring(block.decode("utf-8", errors="replace"))
    except ET.ParseError:
        return {}
    out: dict[str, str] = {}
    for data in root.iter("Data"):
        label, value = data.findtext("Label"), data.findtext("Value")
        if label is None or value is None:
            continue
        unit = (data.findtext("Unit") or "").strip()
        key = f"ExperimentalDescription/{label.strip()}" + (f" [{unit}]" if unit else "")
        out.setdefault(key, value.strip())

    def visit(elem: ET.Element, prefix: str) -> None:
        for child in elem:
            if len(out) >= _MAX_METADATA_ENTRIES or child.tag in ("ExperimentalDescription",):
                continue
            if len(child):
                visit(child, f"{prefix}{child.tag}/")
            elif child.text and child.text.strip() and len(child.text) <= 200:
                out.setdefault(f"{prefix}{child.tag}", child.text.strip())

    visit(root, "")
    return out


def _series_beside(ser_or_emi: Path) -> list[tuple[Path, int | None]]:
    """Every ``<stem>_N.ser`` of one acquisition, in series order, with its element kind."""
    stem = ser_or_emi.stem
    if ser_or_emi.suffix.lower() == ".ser":
        stem = re.sub(r"_\d+$", "", stem)
    pattern = re.compile(re.escape(stem) + r"_(\d+)\.ser$", re.IGNORECASE)
    found: list[tuple[int, Path]] = []
    for cand in ser_or_emi.parent.iterdir():
        m = pattern.match(cand.name)
        if m and cand.is_file():
            found.append((int(m.group(1)), cand))
    out: list[tuple[Path, int | None]] = []
    for _, cand in sorted(found):
        try:
            with open(cand, "rb") as f:
                head = f.read(16)
            kind = struct.unpack_from("<I", head, 6)[0] if len(head) >= 10 else None
        except OSError:
            kind = None
        out.append((cand, kind))
    return out


def _image_series_of(emi: Path) -> tuple[Path, str]:
    """The series of an ``.emi`` acquisition that holds 2-D elements, and a note saying so."""
    series = _series_beside(emi)
    images = [c for c, kind in series if kind == _ELEMENT_2D]
    if len(images) == 1:
        others = [c.name for c, _ in series if c != images[0]]
        also = f" (the other series, {others}, hold spectra or other data)" if others else ""
        return images[0], f"the .emi file {str(emi)!r} was given; {images[0].name} opened{also}"
    if not series:
        raise FormatError(
            f"{str(emi)!r} is a TIA .emi file; its data are in {emi.stem}_1.ser (and _2, _3...), "
            "none of which is beside it. Copy the .ser files next to the .emi"
        )
    if not images:
        raise FormatError(
            f"{str(emi)!r} is a TIA .emi file whose series {[c.name for c, _ in series]} hold no "
            "2-D elements (spectra only); a 4D-STEM input needs 2-D frames"
        )
    raise FormatError(
        f"{str(emi)!r} is a TIA .emi file with several series of 2-D frames: "
        f"{[c.name for c in images]}; open the .ser file of the one to read"
    )


class SerSource(FrameSource):
    """A TIA ``.ser`` series of 2-D frames (for example CBED patterns over a STEM scan).

    Parameters
    ----------
    path
        The ``.ser`` file (``name_1.ser``), or the ``.emi`` file, in which
        case the one series beside it holding 2-D frames is opened (a note
        says which); an ``.emi`` with several such series asks which to open.
    scan_shape
        ``None`` to use the header's two scan dimensions (or a sidecar for a
        1-D series); ``(rows, cols)`` or ``"square"`` to give it.
    frame_offset
        Leading frames to skip (only with ``scan_shape``).

    Notes
    -----
    See the module docstring for the row order (reversed to top-first, noted),
    the scan order check and the calibration.
    """

    format: ClassVar[str] = "ser"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ):
        given = check_exists(path, what="TIA .ser file")
        self._extra_notes: list[str] = []
        if given.suffix.lower() == ".emi":
            cand, note = _image_series_of(given)
            self._extra_notes.append(note)
            given = cand.resolve()
        self._path = given
        self._handle_file: PositionalFile | None = None
        p = str(self._path)
        size = self._path.stat().st_size
        with open(self._path, "rb") as f:
            probe = f.read(65536)
        h = parse_ser_header(probe, self._path)
        self._header = h
        if h["DataTypeID"] == _ELEMENT_1D:
            images = [c.name for c, kind in _series_beside(self._path) if kind == _ELEMENT_2D]
            where = (
                f"; the 2-D frames of this acquisition are in {images}: open that file"
                if images
                else "; no series beside it holds 2-D elements"
            )
            raise FormatError(
                f"TIA series {p!r} holds 1-D elements (spectra, DataTypeID 0x4120); a 4D-STEM "
                f"input needs 2-D elements (DataTypeID 0x4122){where}"
            )
        if h["DataTypeID"] != _ELEMENT_2D:
            raise FormatError(
                f"TIA series {p!r}: header field DataTypeID is 0x{h['DataTypeID']:x}; expected "
                "0x4122 (2-D elements)"
            )
        valid, total = int(h["ValidNumberElements"]), int(h["TotalNumberElements"])
        if valid < 1 or valid > total:
            raise FormatError(
                f"TIA series {p!r}: header field ValidNumberElements is {valid} with "
                f"TotalNumberElements {total}; expected 1 <= valid <= total. The file holds no "
                "frames or its header is damaged"
            )
        wide = h["SeriesVersion"] >= 0x0220
        isz = 8 if wide else 4
        aoff = int(h["OffsetArrayOffset"])
        if aoff + 2 * total * isz > size:
            raise FormatError(
                f"TIA series {p!r}: header field OffsetArrayOffset ({aoff}) with "
                f"TotalNumberElements ({total}) places the offset arrays past the end of the "
                f"{size}-byte file; the file is truncated or its header is damaged"
            )
        with open(self._path, "rb") as f:
            f.seek(aoff)
            arrays = np.frombuffer(f.read(2 * total * isz), dtype="<u8" if wide else "<u4")
        offsets = arrays[:valid].astype(np.int64)
        tags = arrays[total : total + valid].astype(np.int64)
        first = self._element_header(int(offsets[0]), size, 0)
        last = self._element_header(int(offsets[-1]), size, valid - 1)
        if last[6:] != first[6:]:
            raise FormatError(
                f"TIA series {p!r}: element {valid - 1} has DataType/ArraySize {last[6:]} but "
                f"element 0 has {first[6:]}; elements of differing types or sizes are not "
                "supported"
            )
        dtype_code, nx, ny = int(first[6]), int(first[7]), int(first[8])
        if dtype_code not in SER_DTYPES:
            raise DtypeError(
                f"TIA series {p!r}: element DataType is {dtype_code}; expected one of "
                f"{sorted(SER_DTYPES)} (9 and 10 are complex, not supported)"
            )
        if nx < 1 or ny < 1:
            raise FormatError(
                f"TIA series {p!r}: element 0 declares ArraySizeX={nx}, ArraySizeY={ny}; "
                "expected positive frame sizes. The file is damaged"
            )
        self._file_dtype = np.dtype(SER_DTYPES[dtype_code])
        frame_bytes = nx * ny * self._file_dtype.itemsize
        element_bytes = _ELEMENT_HEADER.size + frame_bytes
        if int(offsets[-1]) + element_bytes > size:
            raise FormatError(
                f"TIA series {p!r} holds {size} bytes, but element {valid - 1} (offset "
                f"{int(offsets[-1])}) of {element_bytes} bytes (ArraySizeX={nx}, "
                f"ArraySizeY={ny}, DataType={dtype_code}) ends past it; the file is truncated"
            )
        steps = np.diff(offsets)
        if valid > 1 and not (np.all(steps == steps[0]) and steps[0] >= element_bytes):
            raise FormatError(
                f"TIA series {p!r}: the data offset array does not place its {valid} elements "
                f"at one regular stride of at least {element_bytes} bytes; such files are not "
                "supported (convert them with TIA or HyperSpy)"
            )
        self._first_offset = int(offsets[0])
        self._stride = int(steps[0]) if valid > 1 else element_bytes
        if self._first_offset + valid * self._stride > size:
            raise FormatError(
                f"TIA series {p!r} holds {size} bytes, but its {valid} elements at a stride of "
                f"{self._stride} bytes from byte {self._first_offset} end past it; the file is "
                "truncated"
            )
        self._element_cal = {
            "x": {"offset": first[0], "delta": first[1], "element": first[2]},
            "y": {"offset": first[3], "delta": first[4], "element": first[5]},
        }
        self._positions = self._read_positions(tags, size)
        self._extra_notes.append(
            "TIA stores each frame's rows bottom to top; the rows were reversed so that row 0 "
            "is the top row (as TIA displays it)"
        )
        self._emi_path = self._find_emi()
        self._emi = parse_emi(self._emi_path, self._ser_index() - 1) if self._emi_path else {}
        dims = h["dimensions"]
        how: str | None = None
        shape: Sequence[int] | str | None = scan_shape
        if scan_shape is None and len(dims) == 2:
            cols, rows = int(dims[0]["size"]), int(dims[1]["size"])
            if rows * cols != valid:
                hint = (
                    f"; pass scan_shape=({valid // cols}, {cols}) to read the complete rows"
                    if valid % cols == 0
                    else ""
                )
                raise ScanShapeError(
                    f"TIA series {p!r}: its dimensions declare a {rows} x {cols} scan but "
                    f"ValidNumberElements is {valid} of {total} (the acquisition stopped early)"
                    f"{hint}; pass scan_shape=(rows, cols) for the frames present"
                )
            shape, how = (rows, cols), "the .ser dimension records (dimension 2 rows, 1 columns)"
        self._check_scan_order(shape, valid)
        try:
            self._set_frames(
                n_frames=valid,
                frame_shape=(ny, nx),
                dtype=self._file_dtype,
                scan_shape=shape,
                path=self._path,
                frame_offset=frame_offset,
                scan_shape_from=how,
            )
        except ScanShapeError as exc:
            raise ScanShapeError(f"TIA series {p!r}: {exc}") from exc

    # -- opening helpers -------------------------------------------------------------
    def _element_header(self, offset: int, size: int, index: int) -> tuple[Any, ...]:
        p = str(self._path)
        if offset < 0 or offset + _ELEMENT_HEADER.size > size:
            raise FormatError(
                f"TIA series {p!r}: the data offset array places element {index} at byte "
                f"{offset}, outside the {size}-byte file; the file is truncated or damaged"
            )
        with open(self._path, "rb") as f:
            f.seek(offset)
            return _ELEMENT_HEADER.unpack(f.read(_ELEMENT_HEADER.size))

    def _read_positions(self, tags: np.ndarray, size: int) -> list[tuple[float, float]]:
        """Return (x, y) of the first few elements when the tags carry positions."""
        if self._header["TagTypeID"] != _TAG_POSITION:
            return []
        out = []
        with open(self._path, "rb") as f:
            for off in tags[:3]:
                if int(off) <= 0 or int(off) + 24 > size:
                    return []
                f.seek(int(off))
                raw = f.read(24)
                tag_type, _unused, _time, x, y = struct.unpack("<HHIdd", raw)
                if tag_type != _TAG_POSITION:
                    return []
                out.append((float(x), float(y)))
        return out

    def _check_scan_order(self, shape: Sequence[int] | str | None, valid: int) -> None:
        pos = self._positions
        if len(pos) < 2 or isinstance(shape, str) or shape is None:
            return
        cols = int(shape[1])
        if cols < 2:
            return
        (x0, y0), (x1, y1) = pos[0], pos[1]
        if x0 == x1 and y0 != y1:
            raise FormatError(
                f"TIA series {str(self._path)!r}: the position tags show Y changing between "
                f"elements 0 and 1 ({y0:g} -> {y1:g} m) while X stays {x0:g} m: the scan was "
                "stored column by column, which this reader does not transpose. Convert the "
                "file with HyperSpy, or open it with scan_shape=(cols, rows) and transpose "
                "the scan axes yourself"
            )

    def _ser_index(self) -> int:
        m = re.search(r"_(\d+)$", self._path.stem)
        return int(m.group(1)) if m else 1

    def _find_emi(self) -> Path | None:
        stem = re.sub(r"_\d+$", "", self._path.stem)
        for cand in (self._path.with_name(stem + ".emi"), self._path.with_name(stem + ".EMI")):
            if cand.is_file():
                return cand.resolve()
        return None

    def _file(self) -> PositionalFile:
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        return self._handle_file

    # -- properties --------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The ``.ser`` file."""
        return self._path

    @property
    def emi_path(self) -> Path | None:
        """The ``.emi`` file beside it, if any."""
        return self._emi_path

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening (the row reversal among them)."""
        return super().notes + list(self._extra_notes) + self._direction_notes()

    @property
    def identity(self) -> SourceIdentity:
        """Paths (``.ser`` and ``.emi``), sizes and a digest of the header and layout."""
        paths = [self._path] + ([self._emi_path] if self._emi_path is not None else [])
        with open(self._path, "rb") as f:
            head = f.read(min(4096, self._first_offset + _ELEMENT_HEADER.size))
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(x) for x in paths),
            file_sizes=tuple(path_size(x) for x in paths),
            header_sha256=header_digest(
                head,
                self._first_offset,
                self._stride,
                self._n_frames,
                sorted(self._emi.items()),
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Header, dimension records, element calibration, positions and ``.emi`` fields."""
        h = dict(self._header)
        return {
            "header": {
                **{k: v for k, v in h.items() if k != "dimensions"},
                "SeriesVersion": f"0x{h['SeriesVersion']:04x}",
                "DataTypeID": f"0x{h['DataTypeID']:04x}",
                "TagTypeID": f"0x{h['TagTypeID']:04x}",
            },
            "dimensions": [dict(d) for d in h["dimensions"]],
            "stored_dtype": self._file_dtype.str,
            "element_calibration": self._element_cal,
            "element_calibration_units": "not recorded in the .ser file (detector left in px)",
            "first_positions_m": [list(v) for v in self._positions],
            "row_order": "stored bottom to top; reversed on read (row 0 is the top row)",
            "emi_file": str(self._emi_path) if self._emi_path is not None else None,
            "emi": dict(self._emi),
            "calibration_from": self._calibration_from(),
            **self.scan_metadata(),
        }

    def _scan_steps_nm(self) -> tuple[float, float] | None:
        """The signed scan steps (row, col) in nm the dimension records give, if usable."""
        dims = self._header["dimensions"]
        if len(dims) != 2:
            return None
        if (int(dims[1]["size"]), int(dims[0]["size"])) != self._scan.shape:
            return None
        steps = []
        for d in (dims[1], dims[0]):
            if d["units"].strip().lower() not in ("meters", "metres", "m"):
                return None
            v = float(d["delta"]) * 1e9
            if not (math.isfinite(v) and v != 0):
                return None
            steps.append(v)
        return (steps[0], steps[1])

    def _scan_step_nm(self) -> tuple[float, float] | None:
        steps = self._scan_steps_nm()
        return None if steps is None else (abs(steps[0]), abs(steps[1]))

    def _step_signs(self) -> tuple[int, int]:
        steps = self._scan_steps_nm()
        if steps is None:
            return (1, 1)
        return (1 if steps[0] > 0 else -1, 1 if steps[1] > 0 else -1)

    def _direction_notes(self) -> list[str]:
        """A negative scan step's direction, as a note."""
        steps = self._scan_steps_nm()
        out: list[str] = []
        if steps is not None and min(steps) < 0:
            names = [n for n, v in zip(("rows", "columns"), steps, strict=True) if v < 0]
            out.append(
                f"calibration: the .ser records a negative scan step along {' and '.join(names)} "
                f"({steps[0]:.4g}, {steps[1]:.4g} nm): positions decrease with the index. The "
                "magnitude is the scan sampling and the direction is kept as "
                "Calibration.scan_step_signs (a DPC with a fixed rotation_deg uses it)"
            )
        return out

    def _voltage_kv(self) -> float | None:
        for key, value in self._emi.items():
            if key.startswith("ExperimentalDescription/High tension"):
                try:
                    v = float(value)
                except ValueError:
                    return None
                if "[V]" in key:
                    v /= 1000.0
                return v if math.isfinite(v) and v > 0 else None
        return None

    def _calibration_from(self) -> str | None:
        parts = []
        if self._scan_step_nm() is not None:
            parts.append("scan step from the .ser dimension records (metres, magnitude)")
        if self._voltage_kv() is not None:
            parts.append("voltage from the .emi ExperimentalDescription 'High tension'")
        if not parts:
            return None
        return "; ".join(parts) + "; detector uncalibrated (px)"

    @property
    def calibration(self) -> Calibration | None:
        """Scan step (nm) from the dimension records and voltage from the ``.emi``, if known."""
        step = self._scan_step_nm()
        kv = self._voltage_kv()
        if step is None and kv is None:
            return None
        return Calibration(
            scan_sampling=step if step is not None else (1.0, 1.0),
            scan_units="nm" if step is not None else "px",
            accelerating_voltage_kV=kv,
            scan_step_signs=self._step_signs(),
        )

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)``, rows reversed to top-first, native byte order."""
        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        return read_records_into(
            self._file(),
            offset=self._first_offset + start * self._stride,
            record=self._stride,
            head=_ELEMENT_HEADER.size,
            n=stop - start,
            file_dtype=self._file_dtype,
            frame_shape=self._frame_shape,
            out=out,
            flip_rows=True,
            what=f"elements {start}..{stop - 1}",
        )

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
