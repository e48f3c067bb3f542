"""NanoMEGAS ASTAR blockfiles (``.blo``): precession diffraction scans of 8-bit frames.

Layout (little-endian, no padding between fields), as used by the ASTAR
software and documented by the RosettaSciIO/HyperSpy readers; NanoMEGAS
publishes no specification, so the meaning of some fields is inferred:

====== ======= =================== ==============================================
offset type    field               meaning
====== ======= =================== ==============================================
0      6 bytes ``ID``              ``b"IMGBLO"``
6      u2      ``MAGIC``           ``0x0102`` in every known file
8      u4      ``Data_offset_1``   byte offset of the virtual bright-field image
12     u4      ``Data_offset_2``   byte offset of the first frame record
16     u4      ``UNKNOWN1``        flags of the ASTAR software (not used)
20     u2      ``DP_SZ``           frame size: frames are ``DP_SZ x DP_SZ``
22     u2      ``DP_rotation``     pattern rotation (recorded only)
24     u2      ``NX``              scan columns (fast axis)
26     u2      ``NY``              scan rows
28     u2      ``Scan_rotation``   scan rotation in 1/100 degree (recorded only)
30     f8      ``SX``              scan step along a row (between columns), nm
38     f8      ``SY``              scan step between rows, nm
46     u4      ``Beam_energy``     accelerating voltage, V
50     u2      ``SDP``             100 x diffraction pixels per cm (recorded only)
52     u4      ``Camera_length``   camera length (unit unclear; recorded only)
56     f8      ``Acquisition_time`` serial date (days since 1899-12-30)
64     8 f8    ``Centering_N*``    pattern centring (recorded only)
128    14 f8   ``Distortion_N*``   distortion correction (recorded only)
====== ======= =================== ==============================================

A free-text note (NUL padded) fills the bytes from 240 to ``Data_offset_1``;
the virtual bright-field image (``NY x NX`` u8) follows at
``Data_offset_1``.  From ``Data_offset_2`` the file holds ``NX * NY`` frame
records in scan order (columns fastest), each a 6-byte header (``0xAA
0x55`` then a u32 frame number) followed by ``DP_SZ x DP_SZ`` u8 pixels,
rows top to bottom.  Frames are always square.

Calibration: the scan step ``(SY, SX)`` in nm and ``Beam_energy`` give the
calibration when they are positive.  The detector stays in pixels: ``SDP``
is a size on the projection screen in cm and the unit of
``Camera_length`` is not documented, so no angle per pixel is claimed.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import FormatError, ScanShapeError
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile
from .records import read_records_into

__all__ = ["BLOCKFILE_HEADER_BYTES", "BlockfileSource", "parse_blockfile_header", "sniff"]

#: Bytes of the fixed header before the note.
BLOCKFILE_HEADER_BYTES = 240
#: Bytes of the header before every frame (``0xAA 0x55`` + u32 number).
FRAME_HEADER_BYTES = 6
_FRAME_MAGIC = b"\xaa\x55"
_KNOWN_MAGIC = 0x0102
_STRUCT = struct.Struct("<6sHIIIHHHHHddIHId8d14d")


def sniff(path: Path, head: bytes) -> bool:
    """Blockfile: the file starts with ``IMGBLO``."""
    return head[:6] == b"IMGBLO"


def parse_blockfile_header(raw: bytes, path: Path) -> dict[str, Any]:
    """Parse the 240-byte blockfile header.

    Parameters
    ----------
    raw
        The first bytes of the file (at least 240).
    path
        The file, for error messages.

    Returns
    -------
    dict
        The header fields by name (``NX``, ``NY``, ``DP_SZ``, ``SX``...),
        ``Centering`` and ``Distortion`` as lists.

    Raises
    ------
    FormatError
        If the bytes are too short or do not start with ``IMGBLO``.
    """
    if len(raw) < BLOCKFILE_HEADER_BYTES:
        raise FormatError(
            f"{str(path)!r} holds {len(raw)} bytes, fewer than the {BLOCKFILE_HEADER_BYTES}-byte "
            "blockfile header; the file is truncated or not a NanoMEGAS .blo file"
        )
    values = _STRUCT.unpack_from(raw, 0)
    if values[0] != b"IMGBLO":
        raise FormatError(
            f"{str(path)!r} starts with {values[0]!r}, not the blockfile ID b'IMGBLO'; expected "
            "a NanoMEGAS ASTAR .blo file"
        )
    names = (
        "ID",
        "MAGIC",
        "Data_offset_1",
        "Data_offset_2",
        "UNKNOWN1",
        "DP_SZ",
        "DP_rotation",
        "NX",
        "NY",
        "Scan_rotation",
        "SX",
        "SY",
        "Beam_energy",
        "SDP",
        "Camera_length",
        "Acquisition_time",
    )
    out: dict[str, Any] = dict(zip(names, values[: len(names)], strict=True))
    out["ID"] = "IMGBLO"
    out["Centering"] = [float(v) for v in values[len(names) : len(names) + 8]]
    out["Distortion"] = [float(v) for v in values[len(names) + 8 :]]
    return out


class BlockfileSource(FrameSource):
    """A NanoMEGAS ASTAR blockfile (``.blo``) of 8-bit diffraction frames.

    Parameters
    ----------
    path
        The ``.blo`` file.
    scan_shape
        ``None`` to use the header's ``(NY, NX)``; ``(rows, cols)`` to
        override it (same number of frames; recorded as a note).

    Notes
    -----
    Frames are returned as stored, rows top to bottom.  The virtual
    bright-field image and the note are reported in :attr:`metadata`
    (the note only), never used as data.
    """

    format: ClassVar[str] = "blockfile"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | None = None,
    ):
        self._path = check_exists(path, what="blockfile")
        self._handle_file: PositionalFile | None = None
        size = self._path.stat().st_size
        with open(self._path, "rb") as f:
            probe = f.read(4096)
        h = parse_blockfile_header(probe, self._path)
        self._header = h
        p = str(self._path)
        nx, ny, k = int(h["NX"]), int(h["NY"]), int(h["DP_SZ"])
        for name, value in (("NX", nx), ("NY", ny), ("DP_SZ", k)):
            if value < 1:
                raise FormatError(
                    f"blockfile {p!r}: header field {name} is {value}; expected a positive "
                    "size (NX scan columns, NY scan rows, DP_SZ frame side). The header is damaged"
                )
        off1, off2 = int(h["Data_offset_1"]), int(h["Data_offset_2"])
        if off1 < BLOCKFILE_HEADER_BYTES:
            raise FormatError(
                f"blockfile {p!r}: header field Data_offset_1 is {off1}; expected at least "
                f"{BLOCKFILE_HEADER_BYTES} (the virtual image follows the header). The header is "
                "damaged"
            )
        if off2 < off1 + nx * ny:
            raise FormatError(
                f"blockfile {p!r}: header field Data_offset_2 is {off2}, but the {ny} x {nx} "
                f"virtual image at Data_offset_1={off1} ends at {off1 + nx * ny}; expected the "
                "frames after it. The header is damaged"
            )
        record = FRAME_HEADER_BYTES + k * k
        n = nx * ny
        need = off2 + n * record
        if size < need:
            raise FormatError(
                f"blockfile {p!r} holds {size} bytes, but its header (NX={nx}, NY={ny}, "
                f"DP_SZ={k}, Data_offset_2={off2}) declares {n} frame records of {record} bytes "
                f"ending at byte {need}; the file is truncated ({(size - off2) // record} whole "
                "frames present) or the header is wrong"
            )
        self._off2 = off2
        self._record = record
        self._trailing = size - need
        self._note_text = probe[BLOCKFILE_HEADER_BYTES : min(off1, len(probe))]
        with open(self._path, "rb") as f:
            heads = []
            for i in (0, n - 1):
                f.seek(off2 + i * record)
                heads.append(f.read(FRAME_HEADER_BYTES))
        for i, fh in zip((0, n - 1), heads, strict=True):
            if fh[:2] != _FRAME_MAGIC:
                raise FormatError(
                    f"blockfile {p!r}: frame record {i} at byte {off2 + i * record} starts with "
                    f"{fh[:2]!r}, not the frame marker b'\\xaa\\x55'; the header's NX={nx}, "
                    f"NY={ny}, DP_SZ={k} or Data_offset_2={off2} do not match the file"
                )
        self._frame_numbers = [int.from_bytes(x[2:6], "little") for x in heads]
        self._extra_notes: list[str] = []
        if int(h["MAGIC"]) != _KNOWN_MAGIC:
            self._extra_notes.append(
                f"blockfile {p!r} has header MAGIC 0x{int(h['MAGIC']):04x}, not the known "
                f"0x{_KNOWN_MAGIC:04x}; it was read with the known layout"
            )
        how: str | None = "the blockfile header (NY, NX)"
        shape: Sequence[int] = (ny, nx)
        if isinstance(scan_shape, str):
            raise ScanShapeError(
                f"blockfile {p!r}: scan_shape={scan_shape!r} is not accepted; the header gives "
                f"the scan shape ({ny}, {nx}). Pass scan_shape=None to use it, or (rows, cols)"
            )
        if scan_shape is not None:
            given = tuple(int(v) for v in scan_shape)
            if given != (ny, nx):
                self._extra_notes.append(
                    f"scan_shape={given} was given and overrides the scan shape ({ny}, {nx}) "
                    f"written in the header of {p!r}"
                )
            shape, how = given, None
        try:
            self._set_frames(
                n_frames=n,
                frame_shape=(k, k),
                dtype=np.dtype(np.uint8),
                scan_shape=shape,
                path=self._path,
                scan_shape_from=how,
            )
        except ScanShapeError as exc:
            raise ScanShapeError(f"blockfile {p!r}: {exc}") from exc

    def _file(self) -> PositionalFile:
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        return self._handle_file

    @property
    def path(self) -> Path:
        """The ``.blo`` file."""
        return self._path

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        return super().notes + list(self._extra_notes)

    @property
    def identity(self) -> SourceIdentity:
        """Path, size and a digest of the header and the record layout."""
        with open(self._path, "rb") as f:
            head = f.read(min(int(self._header["Data_offset_1"]), 4096))
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(head, self._off2, self._record, self._n_frames),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Header fields, the note, the record layout and where calibration came from."""
        h = {k: v for k, v in self._header.items()}
        note = self._note_text.split(b"\x00", 1)[0].decode("latin-1", errors="replace")
        return {
            "header": h,
            "note": note[:1000],
            "stored_dtype": "|u1",
            "frame_header_bytes": FRAME_HEADER_BYTES,
            "record_bytes": self._record,
            "data_offset": self._off2,
            "trailing_bytes": self._trailing,
            "first_last_frame_numbers": self._frame_numbers,
            "scan_rotation_deg": int(self._header["Scan_rotation"]) / 100.0,
            "diffraction_pixel_cm": (100.0 / self._header["SDP"]) if self._header["SDP"] else None,
            "calibration_from": self._calibration_from(),
            **self.scan_metadata(),
        }

    def _calibration_from(self) -> str | None:
        cal = self.calibration
        if cal is None:
            return None
        parts = []
        if cal.scan_is_calibrated:
            parts.append("scan step SY, SX (nm)")
        if cal.accelerating_voltage_kV is not None:
            parts.append("Beam_energy (V)")
        return f"the blockfile header: {', '.join(parts)}; detector uncalibrated (px)"

    @property
    def calibration(self) -> Calibration | None:
        """Scan step (nm) and voltage from the header, when positive; the detector in px."""
        sx, sy = float(self._header["SX"]), float(self._header["SY"])
        energy = float(self._header["Beam_energy"])
        scan_ok = all(math.isfinite(v) and v > 0 for v in (sx, sy))
        kv = energy / 1000.0 if energy > 0 else None
        if not scan_ok and kv is None:
            return None
        return Calibration(
            scan_sampling=(sy, sx) if scan_ok else (1.0, 1.0),
            scan_units="nm" if scan_ok else "px",
            accelerating_voltage_kV=kv,
        )

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` without their 6-byte headers."""
        if not 0 <= start <= stop <= self._n_frames:
            from ..errors import ShapeError

            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        return read_records_into(
            self._file(),
            offset=self._off2 + start * self._record,
            record=self._record,
            head=FRAME_HEADER_BYTES,
            n=stop - start,
            file_dtype=np.dtype("u1"),
            frame_shape=self._frame_shape,
            out=out,
            what=f"frames {start}..{stop - 1}",
        )

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
