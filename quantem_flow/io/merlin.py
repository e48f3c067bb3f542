"""Quantum Detectors Merlin ``.mib`` files (processed mode).

A ``.mib`` file is a sequence of frame records, each an ASCII header then
the pixel values, big-endian.  The header is comma-separated and starts::

    MQ1,000001,00384,01,00256,00256,U16,   1x1,01,2024-05-01 12:00:00.000000,0.001,...

that is: the ``MQ1`` tag, the frame's sequence number, the data offset (the
header size in bytes: 384 for a single chip, 768 for a quad), the number of
chips, the frame width (columns) and height (rows), the pixel depth
(``U08``, ``U16``, ``U32`` in processed mode, ``R64`` in raw mode), the
sensor layout (``1x1``, ``2x2``, ``Nx1``), the chip select mask, the time
stamp, the shutter time, the counter, the colour and gain modes and the
thresholds.  In processed mode a quad frame is already assembled (for
example 512 x 512), so every record has the same size and the file is read
through a memory map.  An optional Merlin ``.hdr`` acquisition header next
to the file (same stem) is reported in the metadata.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import FormatError
from .base import (
    FrameSource,
    SourceIdentity,
    check_exists,
    header_digest,
    path_size,
    sidecar_calibration,
)
from .raw import RawSource

__all__ = ["MIB_DTYPES", "MerlinSource", "parse_hdr", "parse_mib_header"]

#: On-disk dtype of each processed-mode pixel depth.
MIB_DTYPES: dict[str, str] = {"U08": ">u1", "U16": ">u2", "U32": ">u4"}

_PROBE_BYTES = 4096
_FIELD_NAMES = (
    "tag",
    "sequence_number",
    "header_bytes",
    "n_chips",
    "width",
    "height",
    "pixel_depth",
    "sensor_layout",
    "chip_select",
    "timestamp",
    "shutter_time_s",
    "counter",
    "colour_mode",
    "gain_mode",
)


def parse_mib_header(raw: bytes, path: Path) -> dict[str, Any]:
    """Parse the first fields of one MQ1 frame header.

    Parameters
    ----------
    raw
        The start of a frame record (at least the header).
    path
        The file, for error messages.

    Returns
    -------
    dict
        ``header_bytes``, ``n_chips``, ``width``, ``height``,
        ``pixel_depth``, ``sensor_layout``... and ``thresholds`` when present.

    Raises
    ------
    FormatError
        If the bytes are not an MQ1 header, or describe raw (unprocessed)
        mode data.

    """
    if not raw.startswith(b"MQ1,"):
        raise FormatError(
            f"{str(path)!r} does not start with a Merlin 'MQ1,' frame header (found "
            f"{raw[:8]!r}); expected a Quantum Detectors .mib file"
        )
    text = raw.decode("ascii", errors="replace")
    fields = text.split(",")
    if len(fields) < 8:
        raise FormatError(
            f"the MQ1 header of {str(path)!r} has {len(fields)} fields; expected at least 8 "
            "(tag, sequence, offset, chips, width, height, depth, layout)"
        )
    try:
        header_bytes = int(fields[2])
    except ValueError as exc:
        raise FormatError(
            f"the MQ1 header of {str(path)!r} gives data offset {fields[2]!r}; expected the "
            "header size in bytes (e.g. 00384)"
        ) from exc
    if not 32 <= header_bytes <= len(raw):
        raise FormatError(
            f"the MQ1 header of {str(path)!r} gives a data offset (header size) of "
            f"{header_bytes} bytes but {len(raw)} bytes were available; expected a header "
            "size such as 384 (single chip) or 768 (quad) inside the file"
        )
    fields = raw[:header_bytes].decode("ascii", errors="replace").rstrip("\x00 ").split(",")
    out: dict[str, Any] = {}
    for name, value in zip(_FIELD_NAMES, fields, strict=False):
        out[name] = value.strip()
    for name in ("sequence_number", "header_bytes", "n_chips", "width", "height"):
        try:
            out[name] = int(out[name])
        except (KeyError, ValueError) as exc:
            raise FormatError(
                f"the MQ1 header of {str(path)!r} gives {name}={out.get(name)!r}; expected an "
                "integer"
            ) from exc
    depth = out["pixel_depth"]
    if depth.startswith("R"):
        raise FormatError(
            f"{str(path)!r} holds raw (unprocessed) mode MIB data (pixel depth {depth!r}); raw "
            "mode .mib files are not supported. Record in processed mode (U08/U16/U32), or "
            "convert the file with the Merlin software first"
        )
    if depth not in MIB_DTYPES:
        raise FormatError(
            f"{str(path)!r} has pixel depth {depth!r}; expected one of {sorted(MIB_DTYPES)}"
        )
    try:
        out["shutter_time_s"] = float(out["shutter_time_s"])
    except (KeyError, ValueError):
        out.pop("shutter_time_s", None)
    thresholds = []
    for value in fields[14:22]:
        try:
            thresholds.append(float(value))
        except ValueError:
            break
    if thresholds:
        out["thresholds"] = thresholds
    return out


def parse_hdr(path: Path) -> dict[str, str]:
    """Parse a Merlin ``.hdr`` acquisition header (``key:<TAB>value`` lines)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise FormatError(f"cannot read Merlin header {str(path)!r}: {exc}") from exc
    for line in text.splitlines():
        if line.startswith("HDR") or line.startswith("End"):
            continue
        key, sep, value = line.partition("\t")
        if not sep:
            key, sep, value = line.partition(":")
        key = key.strip().rstrip(":").strip()
        if key:
            out[key] = value.strip()
    return out


class MerlinSource(FrameSource):
    """A Merlin ``.mib`` file of processed-mode frames.

    Parameters
    ----------
    path
        The ``.mib`` file.
    scan_shape
        ``(rows, cols)``; ``"square"`` to assume a square scan (recorded as
        a note); ``None`` to read a JSON sidecar (``x.mib.json`` or
        ``x.json``).  The ``.hdr`` file is not used for the scan shape.
    frame_offset
        Leading frames to skip (for example flyback or trigger frames).

    Notes
    -----
    Frames are returned as stored (rows top to bottom as in the file); no
    flip is applied.

    """

    format: ClassVar[str] = "mib"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ):
        self._path = check_exists(path, what="Merlin .mib file")
        size = self._path.stat().st_size
        with open(self._path, "rb") as f:
            probe = f.read(_PROBE_BYTES)
        self._header = parse_mib_header(probe, self._path)
        head = int(self._header["header_bytes"])
        self._first_header = probe[:head]
        rows, cols = int(self._header["height"]), int(self._header["width"])
        self._file_dtype = np.dtype(MIB_DTYPES[self._header["pixel_depth"]])
        record = head + rows * cols * self._file_dtype.itemsize
        if size < record or size % record:
            raise FormatError(
                f"{str(self._path)!r} holds {size} bytes but its frame records are {record} bytes "
                f"({head}-byte header + {rows} x {cols} x {self._file_dtype.itemsize} bytes), "
                f"which makes {size / record:.4g} frames, not a whole number; the file is "
                "truncated (an interrupted acquisition?) or its records differ in size"
            )
        n_frames = size // record
        with open(self._path, "rb") as f:
            f.seek((n_frames - 1) * record)
            last = f.read(head)
        if not last.startswith(b"MQ1,"):
            raise FormatError(
                f"the last frame record of {str(self._path)!r} (at byte {(n_frames - 1) * record}) "
                f"does not start with an MQ1 header; expected {n_frames} records of {record} "
                "bytes. The headers may differ in size between frames"
            )
        self._last_sequence = _sequence(last)
        self._record = record
        hdr = self._path.with_suffix(".hdr")
        self._hdr_path: Path | None = hdr.resolve() if hdr.is_file() else None
        self._hdr = parse_hdr(self._hdr_path) if self._hdr_path is not None else None
        self._set_frames(
            n_frames=n_frames,
            frame_shape=(rows, cols),
            dtype=self._file_dtype,
            scan_shape=scan_shape,
            path=self._path,
            frame_offset=frame_offset,
        )
        self._raw = RawSource(
            self._path,
            dtype=self._file_dtype,
            frame_shape=(rows, cols),
            scan_shape=self._scan.shape,
            frame_header_bytes=head,
            frame_offset=frame_offset,
        )

    # -- properties --------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The ``.mib`` file."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """Path(s), size(s) and a digest of the first frame header and the layout."""
        paths = [self._path] + ([self._hdr_path] if self._hdr_path is not None else [])
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(p) for p in paths),
            file_sizes=tuple(path_size(p) for p in paths),
            header_sha256=header_digest(
                self._first_header,
                self._file_dtype.str,
                self._frame_shape,
                self._record,
                self._n_frames,
                sorted(self._hdr.items()) if self._hdr is not None else None,
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """First frame header fields, the ``.hdr`` content and the record layout."""
        return {
            "header": dict(self._header),
            "stored_dtype": self._file_dtype.str,
            "record_bytes": self._record,
            "last_sequence_number": self._last_sequence,
            "quad": int(self._header["n_chips"]) == 4,
            "hdr_file": str(self._hdr_path) if self._hdr_path is not None else None,
            "hdr": dict(self._hdr) if self._hdr is not None else None,
            **self.scan_metadata(),
        }

    @property
    def calibration(self) -> Calibration | None:
        """Calibration from a JSON sidecar next to the file, if any."""
        return sidecar_calibration(self._path)

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` without their headers, in native byte order."""
        return self._raw.read_frames(start, stop, out=out)

    def close(self) -> None:
        """Drop the memory map."""
        self._raw.close()


def _sequence(header: bytes) -> int | None:
    parts = header[:64].split(b",")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None
