"""MRC stacks of diffraction frames (Direct Electron cameras and other MRC writers).

Layout (MRC2014, https://www.ccpem.ac.uk/mrc_format/mrc2014.php): a
1024-byte header of 4-byte words, an extended header of ``NSYMBT`` bytes,
then ``NZ`` sections of ``NY`` rows of ``NX`` values (columns fastest).  The
header fields this reader uses (byte offsets):

====== ====== ===========================================================
0      i4     ``NX`` columns, ``NY`` rows (4), ``NZ`` sections (8) = frames
12     i4     ``MODE``: 0 int8, 1 int16, 2 float32, 6 uint16, 12 float16
28     i4     ``MX``, ``MY``, ``MZ`` sampling (recorded only)
40     f4     cell lengths in Å (recorded only)
92     i4     ``NSYMBT``: bytes of the extended header
104    4 char ``EXTTYP`` (``FEI1``, ``FEI2``, ``CCP4``, ``SERI``...) recorded
108    i4     ``NVERSION``
152    i4     IMOD stamp ``1146047817`` and flags (156): mode 0 signedness
208    4 char ``MAP `` (required by MRC2014; older files lack it)
212    4 byte ``MACHST`` byte order: ``44 44`` little, ``11 11`` big endian
====== ====== ===========================================================

Choices of this reader:

* **Mode 0** is signed int8 (MRC2014), except in files stamped by IMOD
  without its "bytes are signed" flag, which IMOD writes unsigned; the
  choice is recorded in the metadata and notes, and ``mode0_unsigned=``
  overrides it (writers that store counts 0..255 without the IMOD stamp).  Complex (3, 4) and 4-bit
  (101) modes are refused.
* **Rows** are returned as stored (row 0 is the first stored row); no flip
  is applied.  Viewers that follow the crystallographic convention show
  that row at the bottom.
* **Scan shape.**  The MRC header records no scan shape.  In order: the
  ``scan_shape`` given; the Direct Electron metadata file beside the movie
  (``<name>_info.txt``, ``key = value`` lines; ``Scan - Size X`` columns and
  ``Scan - Size Y`` rows of a raster scan); a JSON sidecar; else an error.
* **Calibration** comes from the DE metadata when it is there:
  ``Specimen Pixel Size X/Y (nanometers)`` as the scan step.  Detector
  sizes in the DE file carry no unit in their names, so the detector stays
  in pixels (the values are reported in the metadata).  The extended
  header is not interpreted (its type and size are reported).
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import DtypeError, FormatError, ScanShapeError, ShapeError
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile
from .records import read_records_into

__all__ = ["MRC_MODES", "MrcSource", "parse_de_info", "parse_mrc_header", "sniff"]

#: MRC ``MODE`` -> stored dtype (byte order from ``MACHST``); mode 0 per :func:`_mode0`.
MRC_MODES: dict[int, str] = {0: "i1", 1: "i2", 2: "f4", 6: "u2", 12: "f2"}
MRC_HEADER_BYTES = 1024
_IMOD_STAMP = 1146047817


def _order(raw: bytes) -> str:
    stamp = raw[212:214]
    if stamp[:1] == b"\x11":
        return ">"
    if stamp[:1] == b"\x44" or stamp[:1] == b"\x41":
        return "<"
    # No stamp: the byte order whose MODE is a known value.
    little = struct.unpack_from("<i", raw, 12)[0]
    return "<" if little in MRC_MODES or little in (3, 4, 101) else ">"


def sniff(path: Path, head: bytes) -> bool:
    """MRC: ``MAP `` at byte 208 and plausible sizes and mode in the header."""
    if len(head) < MRC_HEADER_BYTES or head[208:212] != b"MAP ":
        return False
    try:
        o = _order(head)
        nx, ny, nz, mode = struct.unpack_from(o + "4i", head, 0)
        (nsymbt,) = struct.unpack_from(o + "i", head, 92)
    except struct.error:
        return False
    return nx > 0 and ny > 0 and nz > 0 and nsymbt >= 0 and mode in (*MRC_MODES, 3, 4, 101)


def parse_mrc_header(raw: bytes, path: Path) -> dict[str, Any]:
    """Parse the 1024-byte MRC header.

    Parameters
    ----------
    raw
        The first bytes of the file (at least 1024).
    path
        The file, for error messages.

    Returns
    -------
    dict
        ``NX``, ``NY``, ``NZ``, ``MODE``, ``NSYMBT``, ``MX``..., ``cell_A``,
        ``EXTTYP``, ``NVERSION``, ``byte_order``, ``imod_stamp``,
        ``imod_flags``, ``has_map_word``, ``labels``.

    Raises
    ------
    FormatError
        If the file is shorter than the header.
    """
    if len(raw) < MRC_HEADER_BYTES:
        raise FormatError(
            f"{str(path)!r} holds {len(raw)} bytes, fewer than the {MRC_HEADER_BYTES}-byte MRC "
            "header; the file is truncated or not an MRC file"
        )
    o = _order(raw)
    nx, ny, nz, mode = struct.unpack_from(o + "4i", raw, 0)
    mx, my, mz = struct.unpack_from(o + "3i", raw, 28)
    cell = struct.unpack_from(o + "3f", raw, 40)
    (nsymbt,) = struct.unpack_from(o + "i", raw, 92)
    exttyp = raw[104:108].decode("latin-1").strip("\x00 ")
    (nversion,) = struct.unpack_from(o + "i", raw, 108)
    stamp, flags = struct.unpack_from(o + "2i", raw, 152)
    (nlabl,) = struct.unpack_from(o + "i", raw, 220)
    labels = [
        raw[224 + 80 * i : 304 + 80 * i].decode("latin-1").strip("\x00 ")
        for i in range(max(0, min(nlabl, 10)))
    ]
    return {
        "NX": nx,
        "NY": ny,
        "NZ": nz,
        "MODE": mode,
        "MX": mx,
        "MY": my,
        "MZ": mz,
        "cell_A": [float(v) for v in cell],
        "NSYMBT": nsymbt,
        "EXTTYP": exttyp,
        "NVERSION": nversion,
        "byte_order": "little" if o == "<" else "big",
        "imod_stamp": stamp == _IMOD_STAMP,
        "imod_flags": flags,
        "has_map_word": raw[208:212] == b"MAP ",
        "labels": labels,
    }


def parse_de_info(path: Path) -> dict[str, str]:
    """Parse a Direct Electron ``*_info.txt`` metadata file (``key = value`` lines)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise FormatError(f"cannot read the DE metadata file {str(path)!r}: {exc}") from exc
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _de_info_candidates(path: Path) -> list[Path]:
    stem = path.stem
    bases = [stem, re.sub(r"_movie$", "", stem, flags=re.IGNORECASE)]
    parts = stem.split("_")
    if len(parts) > 2:
        bases.append("_".join(parts[:2]))
    out = []
    for b in bases:
        cand = path.with_name(b + "_info.txt")
        if cand not in out:
            out.append(cand)
    return out


class MrcSource(FrameSource):
    """An MRC stack whose sections are the diffraction frames of a scan.

    Parameters
    ----------
    path
        The ``.mrc`` file.
    scan_shape
        ``(rows, cols)`` or ``"square"``; ``None`` to read it from the DE
        metadata file beside the movie, else from a JSON sidecar.
    frame_offset
        Leading frames to skip.
    info_file
        The DE ``*_info.txt`` metadata file, when it does not lie beside the
        movie under its usual name; ``False`` to ignore it.
    mode0_unsigned
        For ``MODE`` 0: ``None`` follows the header (signed int8 per MRC2014,
        unsigned for IMOD files without the signed flag); ``True``/``False``
        reads the bytes as uint8/int8 whatever the header says (noted).

    Notes
    -----
    See the module docstring for mode 0, the row order and the calibration.
    """

    format: ClassVar[str] = "mrc"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
        info_file: str | os.PathLike[str] | bool | None = None,
        mode0_unsigned: bool | None = None,
    ):
        self._path = check_exists(path, what="MRC file")
        self._handle_file: PositionalFile | None = None
        p = str(self._path)
        size = self._path.stat().st_size
        with open(self._path, "rb") as f:
            raw = f.read(MRC_HEADER_BYTES)
        h = parse_mrc_header(raw, self._path)
        self._header = h
        self._header_bytes = raw
        self._extra_notes: list[str] = []
        nx, ny, nz, mode, ext = h["NX"], h["NY"], h["NZ"], h["MODE"], h["NSYMBT"]
        for name, value in (("NX", nx), ("NY", ny), ("NZ", nz)):
            if value < 1:
                raise FormatError(
                    f"MRC file {p!r}: header field {name} is {value}; expected a positive size "
                    "(NX columns, NY rows, NZ frames). The header is damaged"
                )
        if ext < 0:
            raise FormatError(
                f"MRC file {p!r}: header field NSYMBT (extended header bytes) is {ext}; expected "
                ">= 0. The header is damaged"
            )
        if mode not in MRC_MODES:
            raise DtypeError(
                f"MRC file {p!r}: header field MODE is {mode}; this reader reads modes "
                f"{sorted(MRC_MODES)} (0 int8, 1 int16, 2 float32, 6 uint16, 12 float16), not "
                "complex (3, 4) or 4-bit (101) data"
            )
        order = "<" if h["byte_order"] == "little" else ">"
        code = MRC_MODES[mode]
        if mode == 0 and mode0_unsigned is not None:
            code = "u1" if mode0_unsigned else "i1"
            self._extra_notes.append(
                f"MRC file {p!r} is MODE 0; its bytes were read as "
                f"{'uint8' if mode0_unsigned else 'int8'} because mode0_unsigned="
                f"{mode0_unsigned} was given"
            )
        elif mode == 0 and h["imod_stamp"] and not int(h["imod_flags"]) & 1:
            code = "u1"
            self._extra_notes.append(
                f"MRC file {p!r} is MODE 0 stamped by IMOD without its signed-bytes flag: "
                "read as uint8 (IMOD's convention), not int8"
            )
        self._file_dtype = np.dtype(order + code)
        self._data_offset = MRC_HEADER_BYTES + ext
        frame_bytes = nx * ny * self._file_dtype.itemsize
        need = self._data_offset + nz * frame_bytes
        if size < need:
            raise FormatError(
                f"MRC file {p!r} holds {size} bytes, but its header (NX={nx}, NY={ny}, NZ={nz}, "
                f"MODE={mode}, NSYMBT={ext}) declares data ending at byte {need}; the file is "
                f"truncated ({max(0, size - self._data_offset) // frame_bytes} whole frames "
                "present) or the header is wrong"
            )
        if size > need:
            self._extra_notes.append(
                f"MRC file {p!r} has {size - need} bytes after the {nz} frames its header "
                "declares; they were ignored"
            )
        if not h["has_map_word"]:
            self._extra_notes.append(
                f"MRC file {p!r} lacks the 'MAP ' word of MRC2014 (an older file); read with "
                "the MRC2014 layout"
            )
        self._info_path, self._info = self._find_info(info_file)
        how: str | None = None
        shape: Sequence[int] | str | None = scan_shape
        if scan_shape is None and self._info:
            de_shape = self._de_scan_shape()
            if de_shape is not None:
                shape = de_shape
                how = f"DE metadata {self._info_path} (Scan - Size Y, Scan - Size X)"
        elif scan_shape is not None and self._info:
            try:
                de_given = self._de_scan_shape()
            except ScanShapeError:
                de_given = None
            if de_given is not None and (
                isinstance(scan_shape, str) or tuple(int(v) for v in scan_shape) != de_given
            ):
                self._extra_notes.append(
                    f"scan_shape={scan_shape!r} was given and overrides the scan shape "
                    f"{de_given} written in {str(self._info_path)!r}"
                )
        try:
            self._set_frames(
                n_frames=nz,
                frame_shape=(ny, nx),
                dtype=self._file_dtype,
                scan_shape=shape,
                path=self._path,
                frame_offset=frame_offset,
                scan_shape_from=how,
            )
        except ScanShapeError as exc:
            where = f" (the shape came from {self._info_path})" if how else ""
            raise ScanShapeError(f"MRC file {p!r}: {exc}{where}") from exc

    def _find_info(
        self, info_file: str | os.PathLike[str] | bool | None
    ) -> tuple[Path | None, dict[str, str]]:
        if info_file is False:
            return None, {}
        if info_file is not None and info_file is not True:
            ip = check_exists(info_file, what="DE metadata file")
            return ip, parse_de_info(ip)
        for cand in _de_info_candidates(self._path):
            if cand.is_file():
                return cand.resolve(), parse_de_info(cand)
        return None, {}

    def _de_scan_shape(self) -> tuple[int, int] | None:
        info = self._info
        if info.get("Scan - Enable", "Enable") != "Enable":
            return None
        if info.get("Scan - Type", "Raster") != "Raster":
            raise ScanShapeError(
                f"DE metadata {self._info_path} describes a {info['Scan - Type']!r} scan, not a "
                "raster; its frames are not in row-major scan order. Pass scan_shape=(rows, "
                "cols) only if you know the order is a raster"
            )
        try:
            cols = int(info["Scan - Size X"])
            rows = int(info["Scan - Size Y"])
        except (KeyError, ValueError):
            return None
        if rows < 1 or cols < 1:
            raise ScanShapeError(
                f"DE metadata {self._info_path} gives Scan - Size X={cols}, Scan - Size "
                f"Y={rows}; expected positive sizes"
            )
        return (rows, cols)

    def _file(self) -> PositionalFile:
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        return self._handle_file

    @property
    def path(self) -> Path:
        """The ``.mrc`` file."""
        return self._path

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        return super().notes + list(self._extra_notes)

    @property
    def identity(self) -> SourceIdentity:
        """Paths (MRC and DE metadata), sizes and a digest of the header and layout."""
        paths = [self._path] + ([self._info_path] if self._info_path is not None else [])
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(x) for x in paths),
            file_sizes=tuple(path_size(x) for x in paths),
            header_sha256=header_digest(
                self._header_bytes, self._file_dtype.str, sorted(self._info.items())
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Header fields, the DE metadata and where the calibration came from."""
        return {
            "header": dict(self._header),
            "stored_dtype": self._file_dtype.str,
            "data_offset": self._data_offset,
            "extended_header_bytes": self._header["NSYMBT"],
            "row_order": "as stored (no flip)",
            "de_info_file": str(self._info_path) if self._info_path is not None else None,
            "de_info": dict(list(self._info.items())[:300]),
            "calibration_from": self._calibration_from(),
            **self.scan_metadata(),
        }

    def _scan_step_nm(self) -> tuple[float, float] | None:
        try:
            sx = float(self._info["Specimen Pixel Size X (nanometers)"])
            sy = float(self._info["Specimen Pixel Size Y (nanometers)"])
        except (KeyError, ValueError):
            return None
        if not all(math.isfinite(v) and v > 0 for v in (sx, sy)):
            return None
        return (sy, sx)

    def _calibration_from(self) -> str | None:
        if self._scan_step_nm() is None:
            return None
        return (
            f"DE metadata {self._info_path}: Specimen Pixel Size Y/X (nanometers); detector "
            "uncalibrated (px)"
        )

    @property
    def calibration(self) -> Calibration | None:
        """Scan step (nm) from the DE metadata file, if any; the detector in px."""
        step = self._scan_step_nm()
        if step is None:
            return None
        return Calibration(scan_sampling=step, scan_units="nm")

    @property
    def streams_blocks(self) -> bool:
        """Frames are fixed-size records: any range reads for the cost of its bytes.

        Measured: a streamed BF + ADF + CoM pass over 512 MiB of u16 frames ran
        1.47x the whole-chunk one in one process, 1.12x on the embedded default.
        """
        return True

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read sections ``[start, stop)`` in native byte order."""
        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        frame_bytes = self._frame_shape[0] * self._frame_shape[1] * self._file_dtype.itemsize
        return read_records_into(
            self._file(),
            offset=self._data_offset + start * frame_bytes,
            record=frame_bytes,
            head=0,
            n=stop - start,
            file_dtype=self._file_dtype,
            frame_shape=self._frame_shape,
            out=out,
            what=f"sections {start}..{stop - 1}",
        )

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
