"""Gatan DigitalMicrograph 4 (``.dm4``) 4-D STEM data (K2, K3, any 4-D image).

A DM4 file is a tree of tags (Gatan's DM4 format; layout as published by
Gatan's partners and in the open descriptions of the DM3/DM4 tag format):

- a 16-byte header: version (big-endian uint32, ``4``), the length of the
  root tag group (big-endian uint64) and the byte order of the data
  (big-endian uint32: ``1`` little-endian, ``0`` big-endian);
- the root tag group: ``sorted`` and ``open`` bytes, then the number of
  tags (big-endian uint64);
- each tag: its kind (``20`` group, ``21`` data), the name's length
  (big-endian uint16), the name, the size in bytes of the rest of the tag
  (big-endian uint64); a group continues as above, a data tag with
  ``%%%%``, the length of its type description (big-endian uint64), the
  description (big-endian uint64s: a simple type code; ``18, length`` for a
  string; ``15, 0, n, (0, type) * n`` for a struct; ``20, type, count`` for
  an array) and the values, in the byte order of the header.

The image is ``ImageList/[i]/ImageData``: ``Data`` (an array),
``DataType`` (Gatan's image type code), ``Dimensions`` (one unnamed integer
per dimension, the fastest varying first) and ``Calibrations/Dimension``
(per dimension ``Origin``, ``Scale`` and ``Units``: a value is
``(index - Origin) * Scale`` in ``Units``).  The first entry of
``ImageList`` is usually a thumbnail; the reader takes the one 4-D image.

Two layouts of 4-D data exist, told apart by the tag
``ImageTags/Meta Data/Data Order Swapped``:

- ``1`` (recent GMS, K2/K3 "C order"): ``Dimensions`` lists
  ``(k_c, k_r, R_c, R_r)`` and the frames are stored one after another,
  read with positional reads into the caller's buffer;
- absent or ``0`` (older GMS, the "hybrid" order): ``Dimensions`` lists
  ``(R_c, R_r, k_c, k_r)`` and the file stores, for each detector pixel,
  the whole scan image of that pixel.  Reading a block of frames gathers
  one run per detector pixel (a strided read, slower on large detectors,
  recorded in the metadata as ``stored_order``); the values are the same.

Calibrations: the scan step from the scan dimensions (``nm``, ``µm``,
``Å``, ``pm``), the detector pixel from the detector dimensions (``1/nm``,
``1/Å`` or ``mrad``; ``1/nm`` converted to ``1/Å``), the optical axis from
the detector dimensions' ``Origin`` when it is not ``(0, 0)``, and the
voltage from ``ImageTags/Microscope Info/Voltage`` (volts).  A unit the
project does not know leaves that axis uncalibrated, with a note.  A JSON
sidecar's calibration overrides the file's.

Not verified against a file written by GMS here: the hybrid layout and the
meaning of ``Data Order Swapped`` follow open-source readers (LiberTEM,
ncempy) and descriptions of real K2/K3 files; DM3 files (32-bit lengths)
are refused with an error.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import FormatError, ShapeError
from .base import (
    FrameSource,
    SourceIdentity,
    calibration_choice,
    check_exists,
    described_calibration,
    drop_unusable_samplings,
    header_digest,
    path_size,
)
from .fileio import PositionalFile

__all__ = [
    "DM_IMAGE_DTYPES",
    "Dm4Source",
    "TagArray",
    "parse_dm4_tags",
    "parse_dm_tags",
    "sniff",
]

#: Tag data type codes -> dtype character (byte order applied from the header).
_TAG_TYPES: dict[int, str] = {
    2: "i2",
    3: "i4",
    4: "u2",
    5: "u4",
    6: "f4",
    7: "f8",
    8: "u1",  # bool
    9: "i1",  # char
    10: "u1",  # octet
    11: "i8",
    12: "u8",
}
#: ``ImageData/DataType`` codes -> dtype character.
DM_IMAGE_DTYPES: dict[int, str] = {
    1: "i2",
    2: "f4",
    6: "u1",
    7: "i4",
    9: "i1",
    10: "u2",
    11: "u4",
    12: "f8",
    14: "u1",  # binary
}
#: Arrays up to this size are read while parsing; larger ones, and every image's ``Data``,
#: are recorded by offset.
_SMALL_ARRAY_BYTES = 1 << 16
_MAX_DEPTH = 64
#: Detector pixels transposed at a time when gathering hybrid-order frames.
_TRANSPOSE_BLOCK = 256
#: Bytes of hybrid-order values gathered at a time (the read's scratch).
_SCRATCH_BYTES = 4 << 20
_SCAN_UNITS = {"nm": ("nm", 1.0), "µm": ("nm", 1000.0), "um": ("nm", 1000.0), "å": ("Å", 1.0)}
_SCAN_UNITS |= {"a": ("Å", 1.0), "pm": ("pm", 1.0), "angstrom": ("Å", 1.0)}
_DETECTOR_UNITS = {"1/nm": ("1/Å", 0.1), "1/å": ("1/Å", 1.0), "1/a": ("1/Å", 1.0)}
_DETECTOR_UNITS |= {"mrad": ("mrad", 1.0), "rad": ("mrad", 1000.0)}


def sniff(path: Path, head: bytes) -> bool:
    """A DM4 header: version 4 (big-endian), a root length and a byte-order flag 0 or 1."""
    if len(head) < 26:
        return False
    version, root_len, order = struct.unpack(">IQI", head[:16])
    return version == 4 and root_len > 0 and order in (0, 1) and head[16] in (0, 1)


@dataclasses.dataclass(frozen=True)
class TagArray:
    """A large tag array left in the file: where it is, its dtype and length."""

    offset: int
    dtype: str
    count: int

    @property
    def nbytes(self) -> int:
        """Bytes it occupies."""
        return self.count * np.dtype(self.dtype).itemsize


class _Reader:
    """Sequential reads of the tag tree, every one checked against the file's end."""

    def __init__(self, f: BinaryIO, path: Path, size: int, order: str, *, version: int = 4):
        self.f, self.path, self.size, self.order = f, path, size, order
        # DM4 counts, sizes and type descriptions in uint64s, DM3 in uint32s; DM3 tags carry
        # no size of their own
        self.wide = "Q" if version == 4 else "I"
        self.sized = version == 4

    def take(self, n: int, where: str) -> bytes:
        pos = self.f.tell()
        data = self.f.read(n)
        if len(data) != n:
            raise FormatError(
                f"{str(self.path)!r} ends at byte {self.size} while reading {where} ({n} bytes at "
                f"byte {pos}); the file is truncated (an interrupted save or copy?)"
            )
        return data

    def big(self, fmt: str, where: str) -> int:
        value: int = struct.unpack(">" + fmt, self.take(struct.calcsize(fmt), where))[0]
        return value

    def group(self, where: str, depth: int) -> dict[str, Any]:
        if depth > _MAX_DEPTH:
            raise FormatError(
                f"{str(self.path)!r}: tag groups nest deeper than {_MAX_DEPTH} at {where!r}; the "
                "tag tree is damaged"
            )
        self.take(2, f"the sorted/open flags of group {where!r}")
        n = self.big(self.wide, f"the tag count of group {where!r}")
        if n > self.size:
            raise FormatError(
                f"{str(self.path)!r}: group {where!r} declares {n} tags, more than the file's "
                f"{self.size} bytes could hold; the tag tree is damaged"
            )
        out: dict[str, Any] = {}
        for i in range(n):
            kind = self.big("B", f"the kind of tag {i} of {where!r}")
            name_len = self.big("H", f"the name length of tag {i} of {where!r}")
            name = self.take(name_len, f"the name of tag {i} of {where!r}").decode("latin-1")
            label = name if name else f"[{i}]"
            if label in out:
                label = f"{label}[{i}]"
            here = f"{where}/{label}" if where else label
            tag_size = self.big("Q", f"the size of tag {here!r}") if self.sized else 0
            start = self.f.tell()
            if kind == 21 and start + tag_size > self.size:  # groups: their tags tell where
                raise FormatError(
                    f"{str(self.path)!r}: tag {here!r} declares {tag_size} bytes from byte "
                    f"{start}, past the end of the file ({self.size} bytes); the file is "
                    "truncated"
                )
            if kind == 20:
                out[label] = self.group(here, depth + 1)
            elif kind == 21:
                out[label] = self.data(here)
            else:
                raise FormatError(
                    f"{str(self.path)!r}: tag {here!r} at byte {start} has kind {kind}; expected "
                    "20 (group) or 21 (data). The tag tree is damaged"
                )
        return out

    def simple(self, code: int, where: str) -> Any:
        char = _TAG_TYPES.get(code)
        if char is None:
            raise FormatError(
                f"{str(self.path)!r}: tag {where!r} has data type {code}; expected one of "
                f"{sorted(_TAG_TYPES)}"
            )
        dt = np.dtype(self.order + char)
        return np.frombuffer(self.take(dt.itemsize, f"the value of {where!r}"), dt)[0].item()

    def data(self, where: str) -> Any:
        magic = self.take(4, f"the '%%%%' mark of tag {where!r}")
        if magic != b"%%%%":
            raise FormatError(
                f"{str(self.path)!r}: data tag {where!r} starts with {magic!r}; expected '%%%%'. "
                "The tag tree is damaged"
            )
        n = self.big(self.wide, f"the type description length of {where!r}")
        if not 1 <= n <= 1 << 16:
            raise FormatError(
                f"{str(self.path)!r}: tag {where!r} declares a type description of {n} entries; "
                "the tag tree is damaged"
            )
        info = [self.big(self.wide, f"the type description of {where!r}") for _ in range(n)]
        code = info[0]
        if (code == 18 and n < 2) or (code == 20 and n < 3) or (code == 15 and n < 3):
            raise FormatError(
                f"{str(self.path)!r}: tag {where!r} has type {code} with a description of "
                f"{n} entries, too short for its kind; the tag tree is damaged"
            )
        if code == 15:  # struct: 15, name length, n fields, (name length, type) * n
            return tuple(self.simple(t, where) for t in info[4::2])
        if code == 18:  # string of info[1] UTF-16 characters
            return self.take(2 * info[1], f"the string {where!r}").decode("utf-16-le", "replace")
        if code != 20:
            return self.simple(code, where)
        elem = info[1]
        if elem == 15:  # array of structs: skipped (never image data)
            field_bytes = sum(np.dtype(_TAG_TYPES.get(t, "u1")).itemsize for t in info[5::2])
            skip = field_bytes * info[-1]
            self.f.seek(self.f.tell() + skip)
            return None
        char = _TAG_TYPES.get(elem)
        if char is None or len(info) < 3:
            raise FormatError(
                f"{str(self.path)!r}: array tag {where!r} has element type {elem}; expected one "
                f"of {sorted(_TAG_TYPES)}"
            )
        dt = np.dtype(self.order + char)
        count = info[2]
        offset = self.f.tell()
        if offset + count * dt.itemsize > self.size:
            raise FormatError(
                f"{str(self.path)!r}: array {where!r} of {count} x {dt.itemsize} bytes from byte "
                f"{offset} runs past the end of the file ({self.size} bytes); the file is "
                "truncated"
            )
        if count * dt.itemsize <= _SMALL_ARRAY_BYTES and not where.endswith("/Data"):
            return np.frombuffer(self.take(count * dt.itemsize, f"array {where!r}"), dt).copy()
        self.f.seek(offset + count * dt.itemsize)
        return TagArray(offset=offset, dtype=dt.str, count=count)


def parse_dm4_tags(path: Path) -> tuple[dict[str, Any], str]:
    """Parse the tag tree of a DM4 file, leaving large arrays in the file.

    Parameters
    ----------
    path
        The ``.dm4`` file.

    Returns
    -------
    tuple of (dict, str)
        The tags (groups as dicts; unnamed tags as ``"[i]"``; small arrays
        as NumPy arrays, large ones as :class:`TagArray`) and the byte
        order of the data (``"<"`` or ``">"``).

    Raises
    ------
    FormatError
        Not a DM4 file, a DM3 file, or a damaged or truncated tag tree
        (the message names the tag).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = _header(f, path, 16, 4)
        version = struct.unpack(">I", head[:4])[0]
        if version == 3:
            raise FormatError(
                f"{str(path)!r} is a DigitalMicrograph 3 (.dm3) file; only DM4 is read. Save it "
                "as .dm4 from GMS, or convert it"
            )
        if version != 4:
            raise FormatError(
                f"{str(path)!r} starts with version {version}; expected 4 (a Gatan .dm4 file)"
            )
        order = _byte_order(path, head[12:16], 4)
        tags = _Reader(f, path, size, order).group("", 0)
    return tags, order


def _header(f: Any, path: Path, n: int, version: int) -> bytes:
    """The first ``n`` bytes of a DM``version`` file, or the error naming a shorter file."""
    head: bytes = f.read(n)
    if len(head) < n:
        raise FormatError(
            f"{str(path)!r} holds {len(head)} bytes; a DM{version} file starts with a {n}-byte "
            "header"
        )
    return head


def _byte_order(path: Path, raw: bytes, version: int) -> str:
    """The data's byte order from a DM header's flag (big-endian uint32: 1 little, 0 big)."""
    flag = struct.unpack(">I", raw)[0]
    if flag not in (0, 1):
        raise FormatError(
            f"{str(path)!r}: the DM{version} byte-order flag is {flag}; expected 1 "
            "(little-endian) or 0 (big-endian)"
        )
    return "<" if flag == 1 else ">"


def parse_dm_tags(path: Path) -> tuple[dict[str, Any], str, int]:
    """Parse the tag tree of a DM3 or DM4 tag file (``.dm3``, ``.dm4``, a K2 ``.gtg``).

    DM3 differs from DM4 (see the module docstring) in its 12-byte header
    (version 3, the root length and the byte-order flag as big-endian
    uint32s), its tag counts and type descriptions in big-endian uint32s and
    its tags carrying no size of their own.

    Returns
    -------
    tuple of (dict, str, int)
        The tags (as :func:`parse_dm4_tags`), the byte order of the data and
        the version (3 or 4).

    Raises
    ------
    FormatError
        Neither version, or a damaged or truncated tag tree (naming the tag).
    """
    with open(path, "rb") as f:
        head = f.read(4)
    version = struct.unpack(">I", head)[0] if len(head) == 4 else None
    if version == 4:
        tags, order = parse_dm4_tags(path)
        return tags, order, 4
    if version != 3:
        raise FormatError(
            f"{str(path)!r} starts with version {version}; expected a DigitalMicrograph tag "
            "file (3 or 4)"
        )
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = _header(f, path, 12, 3)
        order = _byte_order(path, head[8:12], 3)
        tags = _Reader(f, path, size, order, version=3).group("", 0)
    return tags, order, 3


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "ui":
        return "".join(chr(int(v)) for v in value if int(v) != 0)
    return str(value)


def _get(tree: Any, *names: str) -> Any:
    for name in names:
        if not isinstance(tree, dict) or name not in tree:
            return None
        tree = tree[name]
    return tree


@dataclasses.dataclass(frozen=True)
class _Axis:
    scale: float
    origin: float
    units: str


class Dm4Source(FrameSource):
    """A 4-D image of a Gatan ``.dm4`` file.

    Parameters
    ----------
    path
        The ``.dm4`` file.
    scan_shape
        ``(rows, cols)`` to reshape the scan (same number of frames);
        ``None`` for the shape the file records.
    image_index
        Which entry of ``ImageList`` to read; ``None`` for the only 4-D one.
    """

    format: ClassVar[str] = "dm4"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        image_index: int | None = None,
    ):
        self._path = check_exists(path, what="DM4 file")
        self._handle_file: PositionalFile | None = None
        tags, order = parse_dm4_tags(self._path)
        images = _get(tags, "ImageList")
        if not isinstance(images, dict) or not images:
            raise FormatError(f"{str(self._path)!r} has no ImageList tag group; no image to read")
        entries = list(images.values())
        dims_of = [self._dimensions_of(e) for e in entries]
        if image_index is None:
            four = [i for i, d in enumerate(dims_of) if d is not None and len(d) == 4]
            if len(four) != 1:
                found = [len(d) if d is not None else None for d in dims_of]
                shapes = [tuple(d) if d is not None else None for d in dims_of]
                if not four:
                    kinds = {1: "a spectrum", 2: "an image", 3: "a stack or spectrum image"}
                    held = ", ".join(
                        kinds.get(len(d), f"{len(d)}-D data") if d is not None else "no data"
                        for d in dims_of
                    )
                    raise FormatError(
                        f"{str(self._path)!r} holds no 4-D STEM dataset: its ImageList entries "
                        f"are {held} (dimensions {shapes}). quantem-flow reads 4-D data (R_r, "
                        "R_c, k_r, k_c); a 3-D stack of diffraction patterns can be read with "
                        "another DM reader (rosettasciio) and given as an array: "
                        "qf.open(frames, scan_shape=(rows, cols))"
                    )
                raise FormatError(
                    f"{str(self._path)!r} holds {len(four)} 4-D images (ImageList entries have "
                    f"dimensions {found}); expected exactly one. Pass image_index= the entry "
                    f"to read (one of {four})"
                )
            image_index = four[0]
        if not 0 <= image_index < len(entries):
            raise FormatError(
                f"{str(self._path)!r}: image_index={image_index} is outside its {len(entries)} "
                "ImageList entries"
            )
        entry = entries[image_index]
        dims = dims_of[image_index]
        if dims is None or len(dims) != 4:
            raise ShapeError(
                f"{str(self._path)!r}: ImageList entry {image_index} has ImageData/Dimensions "
                f"{dims}; expected 4 dimensions (a 4-D STEM dataset)"
            )
        self._image_index = image_index
        data = _get(entry, "ImageData", "Data")
        if not isinstance(data, TagArray):
            raise FormatError(
                f"{str(self._path)!r}: ImageList entry {image_index} has no ImageData/Data array"
            )
        code = _get(entry, "ImageData", "DataType")
        char = DM_IMAGE_DTYPES.get(code) if isinstance(code, int) else None
        if char is None:
            raise FormatError(
                f"{str(self._path)!r}: ImageData/DataType is {code!r}; expected one of "
                f"{sorted(DM_IMAGE_DTYPES)} (integer or real images)"
            )
        file_dtype = np.dtype(order + char)
        if np.dtype(data.dtype).itemsize != file_dtype.itemsize:
            raise FormatError(
                f"{str(self._path)!r}: ImageData/DataType {code} means {file_dtype.itemsize}-byte "
                f"values but ImageData/Data is an array of {np.dtype(data.dtype).itemsize}-byte "
                "elements; the tags are inconsistent"
            )
        n_values = int(np.prod(dims, dtype=np.int64))
        if data.count * np.dtype(data.dtype).itemsize != n_values * file_dtype.itemsize:
            raise ShapeError(
                f"{str(self._path)!r}: ImageData/Dimensions {dims} make {n_values} values of "
                f"{file_dtype.itemsize} bytes but ImageData/Data holds "
                f"{data.count * np.dtype(data.dtype).itemsize} bytes; the header lies or the file "
                "is damaged"
            )
        swapped_tag = _get(entry, "ImageTags", "Meta Data", "Data Order Swapped")
        self._swapped = bool(swapped_tag) if swapped_tag is not None else False
        if self._swapped:  # (k_c, k_r, R_c, R_r), frames contiguous
            kc, kr, cols, rows = dims
            det_axes, scan_axes = (1, 0), (3, 2)
        else:  # (R_c, R_r, k_c, k_r), one scan image per detector pixel
            cols, rows, kc, kr = dims
            det_axes, scan_axes = (3, 2), (1, 0)
        self._dims = tuple(dims)
        self._data = data
        self._file_dtype = file_dtype
        self._axes = self._calibration_axes(entry)
        self._det_axes, self._scan_axes = det_axes, scan_axes
        self._voltage = _get(entry, "ImageTags", "Microscope Info", "Voltage")
        self._format_tag = _text(_get(entry, "ImageTags", "Meta Data", "Format"))
        self._swapped_tag = swapped_tag
        self._set_frames(
            n_frames=rows * cols,
            frame_shape=(kr, kc),
            dtype=file_dtype,
            scan_shape=(rows, cols) if scan_shape is None else scan_shape,
            path=None,
            scan_shape_from=("the file (ImageData/Dimensions)" if scan_shape is None else None),
        )

    @staticmethod
    def _dimensions_of(entry: Any) -> list[int] | None:
        dims = _get(entry, "ImageData", "Dimensions")
        if not isinstance(dims, dict):
            return None
        return [int(v) for v in dims.values() if isinstance(v, int)]

    def _calibration_axes(self, entry: Any) -> list[_Axis] | None:
        dim = _get(entry, "ImageData", "Calibrations", "Dimension")
        if not isinstance(dim, dict) or len(dim) != 4:
            return None
        axes = []
        for d in dim.values():
            try:
                axes.append(
                    _Axis(
                        scale=float(_get(d, "Scale")),
                        origin=float(_get(d, "Origin")),
                        units=_text(_get(d, "Units")).strip(),
                    )
                )
            except (TypeError, ValueError):
                return None
        return axes

    # -- calibration ---------------------------------------------------------------
    def _file_calibration(self) -> tuple[Calibration | None, list[str], list[str]]:
        """The calibration the tags record, what was used, and notes on what was not."""
        used: list[str] = []
        notes: list[str] = []
        kwargs: dict[str, Any] = {}
        if self._axes is not None:
            scan = [self._axes[i] for i in self._scan_axes]  # (row, col)
            det = [self._axes[i] for i in self._det_axes]
            for kind, axes in (("scan", scan), ("detector", det)):
                scales = [a.scale for a in axes]
                if any(a.units for a in axes) and not all(
                    math.isfinite(v) and v > 0 for v in scales
                ):
                    notes.append(
                        f"the DM4 {kind} calibration scales {scales} (Calibrations/Dimension/"
                        f"Scale) are not finite and positive; the {kind} was left uncalibrated"
                    )
            usable = [all(math.isfinite(a.scale) and a.scale > 0 for a in g) for g in (scan, det)]
            s_units = {_SCAN_UNITS.get(a.units.lower()) for a in scan}
            if usable[0] and len(s_units) == 1 and (su := s_units.pop()) is not None:
                kwargs["scan_sampling"] = (scan[0].scale * su[1], scan[1].scale * su[1])
                kwargs["scan_units"] = su[0]
                used.append(f"scan step {scan[0].scale:g} x {scan[1].scale:g} {scan[0].units}")
            elif usable[0] and any(a.units for a in scan):
                notes.append(
                    f"the DM4 scan calibration units {[a.units for a in scan]} are not a length "
                    "this project knows (nm, µm, Å, pm) or differ between rows and columns; the "
                    "scan was left uncalibrated"
                )
            d_units = {_DETECTOR_UNITS.get(a.units.lower()) for a in det}
            if usable[1] and len(d_units) == 1 and (du := d_units.pop()) is not None:
                kwargs["detector_sampling"] = (det[0].scale * du[1], det[1].scale * du[1])
                kwargs["detector_units"] = du[0]
                used.append(f"detector pixel {det[0].scale:g} x {det[1].scale:g} {det[0].units}")
                origin_ok = all(math.isfinite(a.origin) for a in det)
                if origin_ok and (det[0].origin, det[1].origin) != (0.0, 0.0):
                    kwargs["detector_origin"] = (det[0].origin, det[1].origin)
                    used.append(f"optical axis at pixel ({det[0].origin:g}, {det[1].origin:g})")
            elif usable[1] and any(a.units for a in det):
                notes.append(
                    f"the DM4 detector calibration units {[a.units for a in det]} are not 1/nm, "
                    "1/Å or mrad, or differ between rows and columns; the detector was left "
                    "uncalibrated"
                )
        if isinstance(self._voltage, (int, float)) and self._voltage > 0:
            kv = float(self._voltage) / 1000.0
            if 10.0 <= kv <= 2000.0:
                kwargs["accelerating_voltage_kV"] = kv
                used.append(f"voltage {kv:g} kV")
            else:
                notes.append(
                    f"ImageTags/Microscope Info/Voltage is {self._voltage!r} V ({kv:g} kV), "
                    "outside 10-2000 kV; the voltage was not taken from it"
                )
        drop_unusable_samplings(kwargs, used, notes, "the DM4 calibration")
        if not kwargs:
            return None, used, notes
        return Calibration(**kwargs), used, notes

    def _calibration_choice(self) -> tuple[Calibration | None, str | None]:
        return calibration_choice(
            self._path,
            lambda: described_calibration(
                self._file_calibration(), "DM4 tags (ImageData/Calibrations, Microscope Info)"
            ),
        )

    @property
    def calibration(self) -> Calibration | None:
        """A JSON sidecar's calibration, else the one the DM4 tags record."""
        return self._calibration_choice()[0]

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        return [*super().notes, *self._file_calibration()[2]]

    # -- description -------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The ``.dm4`` file."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """Path, size and a digest of the layout the reader relied on."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(
                self._dims,
                self._file_dtype.str,
                self._data.offset,
                self._swapped,
                self._axes,
                self._voltage,
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Dimensions, order, data offset and dtype, calibration tags."""
        return {
            "image_index": self._image_index,
            "dimensions": list(self._dims),
            "data_order_swapped": self._swapped_tag,
            "stored_order": (
                "C (frames contiguous; Data Order Swapped = 1)"
                if self._swapped
                else "hybrid (one scan image per detector pixel; Data Order Swapped absent or 0)"
            ),
            "data_offset": self._data.offset,
            "stored_dtype": self._file_dtype.str,
            "format_tag": self._format_tag,
            "calibrations": (
                [dataclasses.asdict(a) for a in self._axes] if self._axes is not None else None
            ),
            "voltage_V": self._voltage,
            "calibration_from": self._calibration_choice()[1],
            **self.scan_metadata(),
        }

    # -- reading ---------------------------------------------------------------------------
    def _file(self) -> PositionalFile:
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        return self._handle_file

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` (flat scan order) in native byte order."""
        if not 0 <= start < stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        shape = (stop - start, *self._frame_shape)
        target = out
        if target is None or not (
            target.shape == shape and target.dtype == self._dtype and target.flags.c_contiguous
        ):
            target = np.empty(shape, dtype=self._dtype)
        frame_values = self._frame_shape[0] * self._frame_shape[1]
        if self._swapped:
            self._file().readinto(
                self._data.offset + start * frame_values * self._file_dtype.itemsize,
                target,
                what=f"frames {start}..{stop - 1} of ImageData/Data",
            )
            if not self._file_dtype.isnative and self._file_dtype.itemsize > 1:
                target.byteswap(inplace=True)
        else:
            # one run of frames per detector pixel; the map is dropped before returning
            mm = np.memmap(
                self._path,
                dtype=self._file_dtype,
                mode="r",
                offset=self._data.offset,
                shape=(frame_values, self._n_frames),
            )
            flat = target.reshape(stop - start, frame_values)
            per = max(1, _SCRATCH_BYTES // (frame_values * self._file_dtype.itemsize))
            try:
                for f0 in range(start, stop, per):  # a bounded scratch of a few MiB
                    f1 = min(stop, f0 + per)
                    runs = np.array(mm[:, f0:f1])  # one short run per detector pixel
                    part = flat[f0 - start : f1 - start]
                    for p0 in range(0, frame_values, _TRANSPOSE_BLOCK):  # cache-friendly
                        part[:, p0 : p0 + _TRANSPOSE_BLOCK] = runs[p0 : p0 + _TRANSPOSE_BLOCK].T
            finally:
                del mm
        if out is not None and target is not out:
            np.copyto(out, target, casting="same_kind")
            return out
        return target

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
