"""TVIPS recorder streams (``.tvips``): frames split over ``_000.tvips``, ``_001.tvips``...

TVIPS publishes no specification; the layout below is the one the
RosettaSciIO/HyperSpy reader and writer use, and the field meanings marked
"recorded only" are not certain.  All values are little-endian.

The first file (``name_000.tvips``) starts with a 256-byte general header
of u4 words: ``size`` (bytes of this header, where the first frame record
starts), ``version`` (1 or 2), ``dimx`` (frame columns), ``dimy`` (frame
rows), ``bitsperpixel`` (8, 16 or 32; unsigned), ``offsetx``, ``offsety``,
``binx``, ``biny``, ``pixelsize`` (nm in imaging, 1/nm in diffraction;
recorded only), ``ht`` (high tension, kV), ``magtotal`` (recorded only),
``frameheaderbytes``, then 204 bytes of filler.  Frame records follow: a
frame header (12 bytes in version 1, ``frameheaderbytes`` in version 2) and
the ``dimy x dimx`` pixels, columns fastest.  The version 2 frame header
starts with u4 ``num``, ``timestamp`` (s), ``ms``, ``LUTidx``, f4
``fcurrent``, u4 ``mag``, ``mode`` (1 imaging, 2 diffraction), five f4 stage
coordinates, u4 ``rotidx`` (the rotator's scan position, 1-based, 0 outside
a scan), f4 ``temperature``, ``objective``.  Later files
(``name_001.tvips``...) hold only whole frame records, no header.

What this reader supports:

* Files ``_000``, ``_001``... are found from any of them (opening ``_001``
  reads the whole series from ``_000``; a note says so) and read as one
  sequence of frames; every file must hold whole records.
* The scan is a raster in storage order (columns fastest, flyback).
  ``scan_shape`` is given (or a sidecar, or ``"square"``) with
  ``frame_offset=N`` to skip leading frames, or ``frame_offset="rotidx"``:
  the scan starts at the first frame whose ``rotidx`` is 1, and the frame
  ``rows * cols - 1`` later must carry ``rotidx = rows * cols`` (no dropped
  or repeated positions); frames after the scan are then ignored, with a
  note.  Serpentine ("winding") scans, hysteresis correction and re-gridding
  of dropped frames are not supported.
* Calibration: ``ht`` gives the accelerating voltage (kV) when positive.
  The header records no scan step, and ``pixelsize`` is an integer whose
  unit depends on the mode, so the scan and the detector stay in pixels
  (``pixelsize`` and ``mode`` are reported in the metadata).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import FormatError, ScanShapeError, ShapeError
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile
from .records import read_records_into

__all__ = ["TVIPS_HEADER_BYTES", "TvipsSource", "parse_tvips_header", "sniff", "tvips_series"]

TVIPS_HEADER_BYTES = 256
_FIELDS = (
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
_FRAME_FIELDS = struct.Struct("<IIIIfII5fIff")  # 60 bytes of the version 2 frame header
_ROTIDX_AT = 48
_BITS = {8: "u1", 16: "<u2", 32: "<u4"}
_SERIES = re.compile(r"^(?P<base>.*)_(?P<num>\d{3})$")


def sniff(path: Path, head: bytes) -> bool:
    """TVIPS: a ``.tvips`` name and a general header of version 1/2 with 8/16/32-bit pixels."""
    if not path.name.lower().endswith(".tvips") or len(head) < TVIPS_HEADER_BYTES:
        return False
    size, version, dimx, dimy, bits = struct.unpack_from("<5I", head, 0)
    return (
        size >= TVIPS_HEADER_BYTES and version in (1, 2) and dimx > 0 and dimy > 0 and bits in _BITS
    )


def tvips_series(path: Path) -> list[Path]:
    """Return the files of the series ``path`` belongs to, ``_000`` first.

    A name without a ``_NNN`` suffix is a series of one file.  The series
    ends at the first missing number.
    """
    m = _SERIES.match(path.stem)
    if m is None:
        return [path]
    out = []
    i = 0
    while True:
        cand = path.with_name(f"{m.group('base')}_{i:03d}{path.suffix}")
        if not cand.is_file():
            break
        out.append(cand.resolve())
        i += 1
    return out


def parse_tvips_header(raw: bytes, path: Path) -> dict[str, int]:
    """Parse the 256-byte general header of the first file of a series.

    Raises
    ------
    FormatError
        If the file is shorter than the header or the header's version or
        pixel depth is unknown.
    """
    p = str(path)
    if len(raw) < TVIPS_HEADER_BYTES:
        raise FormatError(
            f"TVIPS file {p!r} holds {len(raw)} bytes, fewer than the {TVIPS_HEADER_BYTES}-byte "
            "general header; the file is truncated or is not the first (_000) file of a series"
        )
    h = dict(zip(_FIELDS, struct.unpack_from("<13I", raw, 0), strict=True))
    if h["version"] not in (1, 2):
        raise FormatError(
            f"TVIPS file {p!r}: general header field version is {h['version']}; expected 1 or 2. "
            "The file is not the first (_000) file of a TVIPS series, or it is damaged"
        )
    if h["bitsperpixel"] not in _BITS:
        raise FormatError(
            f"TVIPS file {p!r}: general header field bitsperpixel is {h['bitsperpixel']}; "
            f"expected one of {sorted(_BITS)}"
        )
    return h


class TvipsSource(FrameSource):
    """A TVIPS recorder stream of one or more ``.tvips`` files.

    Parameters
    ----------
    path
        Any file of the series (``name_000.tvips``, ``name_001.tvips``...).
    scan_shape
        ``(rows, cols)``, ``"square"``, or ``None`` for a JSON sidecar next to
        the ``_000`` file.
    frame_offset
        Leading frames to skip, or ``"rotidx"`` to start the scan at the first
        frame whose rotator index is 1 (see the module docstring).

    Notes
    -----
    Frames are returned as stored.  See the module docstring for what is
    and is not supported.
    """

    format: ClassVar[str] = "tvips"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int | str = 0,
    ):
        given = check_exists(path, what="TVIPS file")
        self._extra_notes: list[str] = []
        files = tvips_series(given)
        if not files:
            m = _SERIES.match(given.stem)
            first = given.with_name(f"{m.group('base') if m else given.stem}_000{given.suffix}")
            raise FormatError(
                f"{str(given)!r} belongs to a TVIPS series whose first file {first.name!r} "
                "(the one with the general header) does not exist; restore it"
            )
        if files[0] != given:
            self._extra_notes.append(
                f"{given.name} was given; the series was read from its first file {files[0].name}"
            )
        self._files = files
        self._handle_files: dict[int, PositionalFile] | None = None
        p = str(files[0])
        with open(files[0], "rb") as f:
            raw = f.read(4096)
        h = parse_tvips_header(raw, files[0])
        self._header = h
        self._header_bytes = raw[:TVIPS_HEADER_BYTES]
        if h["dimx"] < 1 or h["dimy"] < 1:
            raise FormatError(
                f"TVIPS file {p!r}: general header declares dimx={h['dimx']}, dimy={h['dimy']}; "
                "expected positive frame sizes. The header is damaged"
            )
        if h["size"] < TVIPS_HEADER_BYTES:
            raise FormatError(
                f"TVIPS file {p!r}: general header field size is {h['size']}; expected at least "
                f"{TVIPS_HEADER_BYTES} (the header's own size). The header is damaged"
            )
        fh = 12 if h["version"] == 1 else int(h["frameheaderbytes"])
        if fh < 12:
            raise FormatError(
                f"TVIPS file {p!r}: general header field frameheaderbytes is {fh}; expected at "
                "least 12 (num, timestamp, ms). The header is damaged"
            )
        self._frame_head = fh
        self._file_dtype = np.dtype(_BITS[h["bitsperpixel"]])
        frame_bytes = h["dimx"] * h["dimy"] * self._file_dtype.itemsize
        self._record = fh + frame_bytes
        starts = []
        counts = []
        for i, fp in enumerate(files):
            start = int(h["size"]) if i == 0 else 0
            body = fp.stat().st_size - start
            if body < 0 or body % self._record:
                raise FormatError(
                    f"TVIPS file {str(fp)!r} holds {body + start} bytes: after its "
                    f"{start}-byte header that is {max(body, 0) / self._record:.4g} frame "
                    f"records of {self._record} bytes ({fh}-byte frame header + dimy={h['dimy']} "
                    f"x dimx={h['dimx']} x {h['bitsperpixel']} bits), not a whole number; the "
                    "file is truncated or the header (dimx, dimy, bitsperpixel, "
                    "frameheaderbytes) is wrong"
                )
            starts.append(start)
            counts.append(body // self._record)
        self._starts = starts
        self._cum = [0, *np.cumsum(counts).tolist()]
        n = int(self._cum[-1])
        if n < 1:
            raise FormatError(f"TVIPS series {p!r} holds no frames; expected at least one")
        self._first_frame = self._frame_header(0)
        offset = frame_offset
        usable = n
        if frame_offset == "rotidx":
            offset, usable = self._rotidx_scan(scan_shape, n)
        elif not isinstance(frame_offset, int):
            raise ShapeError(
                f"frame_offset must be a number of frames or 'rotidx', got {frame_offset!r}"
            )
        self._set_frames(
            n_frames=usable,
            frame_shape=(h["dimy"], h["dimx"]),
            dtype=self._file_dtype,
            scan_shape=scan_shape,
            path=files[0],
            frame_offset=int(offset),
        )
        self._total_frames = n

    # -- opening helpers ---------------------------------------------------------
    def _locate(self, frame: int) -> tuple[int, int]:
        """Return (file index, frame index within that file)."""
        i = int(np.searchsorted(self._cum, frame, side="right")) - 1
        return i, frame - int(self._cum[i])

    def _frame_header(self, frame: int) -> dict[str, Any]:
        i, j = self._locate(frame)
        with open(self._files[i], "rb") as f:
            f.seek(self._starts[i] + j * self._record)
            raw = f.read(self._frame_head)
        out: dict[str, Any] = dict(
            zip(("num", "timestamp", "ms"), struct.unpack_from("<3I", raw, 0), strict=True)
        )
        if len(raw) >= _FRAME_FIELDS.size:
            v = _FRAME_FIELDS.unpack_from(raw, 0)
            out.update(
                LUTidx=v[3],
                fcurrent=v[4],
                mag=v[5],
                mode=v[6],
                stage=[float(x) for x in v[7:12]],
                rotidx=v[12],
            )
        elif len(raw) >= _ROTIDX_AT + 4:
            (out["rotidx"],) = struct.unpack_from("<I", raw, _ROTIDX_AT)
        return out

    def _rotidx_scan(self, scan_shape: Sequence[int] | str | None, n: int) -> tuple[int, int]:
        p = str(self._files[0])
        if self._frame_head < _ROTIDX_AT + 4:
            raise ScanShapeError(
                f"TVIPS series {p!r} has {self._frame_head}-byte frame headers without a rotator "
                "index; frame_offset='rotidx' needs version 2 headers. Pass frame_offset=N"
            )
        if scan_shape is None or isinstance(scan_shape, str):
            raise ScanShapeError(
                "frame_offset='rotidx' needs scan_shape=(rows, cols): the rotator index gives "
                "where the scan starts, not its shape"
            )
        count = int(scan_shape[0]) * int(scan_shape[1])
        start = self._first_rotidx_one()
        if start is None:
            raise ScanShapeError(
                f"TVIPS series {p!r}: no frame has rotator index 1, so the scan start is unknown; "
                "pass frame_offset=N"
            )
        last = start + count - 1
        if last >= n:
            raise ScanShapeError(
                f"TVIPS series {p!r}: the scan starts at frame {start} (rotidx 1) but a "
                f"{tuple(scan_shape)} scan needs frames up to {last}, and the series holds {n}"
            )
        got = self._frame_header(last).get("rotidx")
        if got != count:
            raise ScanShapeError(
                f"TVIPS series {p!r}: frame {last}, the last of a {tuple(scan_shape)} scan "
                f"starting at frame {start}, has rotator index {got}, not {count}: the recording "
                "dropped or repeated scan positions, or the scan shape is wrong. This reader does "
                "not re-grid frames by rotator index"
            )
        self._extra_notes.append(
            f"the scan starts at frame {start} (the first with rotator index 1); "
            f"{start} frames before it and {n - last - 1} after it were not read"
        )
        return start, last + 1

    def _first_rotidx_one(self) -> int | None:
        """Return the first frame whose rotator index is 1 (one open per file)."""
        for i, fp in enumerate(self._files):
            count = int(self._cum[i + 1]) - int(self._cum[i])
            with open(fp, "rb") as f:
                for j in range(count):
                    f.seek(self._starts[i] + j * self._record + _ROTIDX_AT)
                    raw = f.read(4)
                    if len(raw) == 4 and struct.unpack("<I", raw)[0] == 1:
                        return int(self._cum[i]) + j
        return None

    def _files_open(self) -> dict[int, PositionalFile]:
        if self._handle_files is None:
            self._handle_files = {}
        return self._handle_files

    # -- properties --------------------------------------------------------------
    @property
    def paths(self) -> list[Path]:
        """Files of the series, ``_000`` first."""
        return list(self._files)

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        return super().notes + list(self._extra_notes)

    @property
    def identity(self) -> SourceIdentity:
        """Every file's path and size, and a digest of the header and layout."""
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(x) for x in self._files),
            file_sizes=tuple(path_size(x) for x in self._files),
            header_sha256=header_digest(self._header_bytes, self._record, self._cum),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """General header, first frame header, files and frame counts."""
        return {
            "header": dict(self._header),
            "first_frame_header": dict(self._first_frame),
            "stored_dtype": self._file_dtype.str,
            "frame_header_bytes": self._frame_head,
            "record_bytes": self._record,
            "files": [str(x) for x in self._files],
            "frames_per_file": [
                int(b) - int(a) for a, b in zip(self._cum[:-1], self._cum[1:], strict=True)
            ],
            "frames_in_series": self._total_frames,
            "calibration_from": (
                "the general header's ht (kV); scan and detector uncalibrated (px)"
                if self.calibration is not None
                else None
            ),
            **self.scan_metadata(),
        }

    @property
    def calibration(self) -> Calibration | None:
        """Accelerating voltage from ``ht`` (kV) when positive; scan and detector in px."""
        ht = int(self._header["ht"])
        if ht <= 0:
            return None
        return Calibration(accelerating_voltage_kV=float(ht))

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` across the series' files, in native byte order."""
        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._files[0])!r}"
            )
        shape = (stop - start, *self._frame_shape)
        native = self._file_dtype.newbyteorder("=")
        target = out
        if target is None or not (
            target.shape == shape and target.dtype == native and target.flags.c_contiguous
        ):
            target = np.empty(shape, dtype=native)
        handles = self._files_open()
        k = start
        while k < stop:
            i, j = self._locate(k)
            n = min(stop, int(self._cum[i + 1])) - k
            if i not in handles:
                handles[i] = PositionalFile(self._files[i])
            read_records_into(
                handles[i],
                offset=self._starts[i] + j * self._record,
                record=self._record,
                head=self._frame_head,
                n=n,
                file_dtype=self._file_dtype,
                frame_shape=self._frame_shape,
                out=target[k - start : k - start + n],
                what=f"frames {k}..{k + n - 1}",
            )
            k += n
        if out is not None and target is not out:
            np.copyto(out, target, casting="same_kind")
            return out
        return target

    def close(self) -> None:
        """Close the files (they reopen on the next read)."""
        if self._handle_files is not None:
            for fh in self._handle_files.values():
                fh.close()
        self._handle_files = None
