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

Raw mode (pixel depth ``R64``) stores the counters as the chip reads them
out: a stream of big-endian 64-bit words, each holding ``64 / s`` pixels in
slots of ``s`` bits, the first pixel in the least significant slot.  The
counter depth (the field after ``MQ1A``, the extended time stamp and the
shutter time in ns; the last field of older headers) gives the slot:

==============  =====  ===================  ==============
counter depth   slot   bytes per pixel      decoded dtype
==============  =====  ===================  ==============
1               1 bit  1/8                  uint8
6               8 bit  1                    uint8
12              16 bit 2                    uint16
24              16 bit 4 (two sub-frames)   uint32
==============  =====  ===================  ==============

A 24-bit frame is two 12-bit sub-frames after one header, the first holding
the 12 most significant bits; its header declares the width of both
(twice the frame's width).  Pixels come in row-major order of the frame.
The word layout is not in the Merlin manual's public pages; it is the
layout that open-source Merlin readers (LiberTEM) decode and that Quantum
Detectors' own tools were checked against by those projects.  The 24-bit
width convention rests on the same source only.

A raw 2x2 quad (1, 6 or 12 bits) is not assembled: its header declares the
four chips' rows side by side (width ``4 s``, height ``s`` for chips of
``s x s``), and each raw row ``j`` is ``[chip 4, chip 3, chip 2, chip 1]``:
chips 1 and 2 are row ``j`` of the top-left and top-right quadrants, chips
3 and 4 row ``2 s - 1 - j`` of the bottom-left and bottom-right quadrants,
reversed left to right (the bottom chips are mounted rotated by 180
degrees).  The frame is assembled to ``2 s x 2 s``, with no gap pixels
inserted.  This arrangement too comes from LiberTEM's
reader, not from the manual.  Other multi-chip layouts and 24-bit quads
are refused with an error rather than decoded on a guess.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import CorruptChunkError, FormatError, ScanShapeError, ShapeError, SourceNotFoundError
from .base import (
    FrameSource,
    SourceIdentity,
    check_exists,
    header_digest,
    path_size,
    sidecar_calibration,
)
from .fileio import PositionalFile
from .raw import RawSource

__all__ = [
    "MIB_DTYPES",
    "RAW_DEPTHS",
    "MerlinSource",
    "decode_raw_frames",
    "parse_hdr",
    "parse_hdr_text",
    "parse_mib_header",
    "raw_frame_layout",
    "raw_payload_bytes",
]

#: On-disk dtype of each processed-mode pixel depth.
MIB_DTYPES: dict[str, str] = {"U08": ">u1", "U16": ">u2", "U32": ">u4"}
#: Raw mode (``R64``): counter depth -> (bits of a pixel's slot in a 64-bit word,
#: decoded dtype).
RAW_DEPTHS: dict[int, tuple[int, str]] = {
    1: (1, "u1"),
    6: (8, "u1"),
    12: (16, "u2"),
    24: (16, "u4"),
}

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
    if depth not in MIB_DTYPES and depth != "R64":
        raise FormatError(
            f"{str(path)!r} has pixel depth {depth!r}; expected one of "
            f"{[*sorted(MIB_DTYPES), 'R64']}"
        )
    counter_depth = _counter_depth(fields)
    if counter_depth is not None and (depth == "R64" or "MQ1A" in fields):
        out["counter_depth"] = counter_depth
    if depth == "R64" and counter_depth not in RAW_DEPTHS:
        raise FormatError(
            f"the MQ1 header of {str(path)!r} has pixel depth 'R64' (raw mode) but its counter "
            f"depth field gives {_counter_depth_text(fields)!r}; expected one of "
            f"{sorted(RAW_DEPTHS)} (the field after 'MQ1A', time stamp and shutter ns, or the "
            "last field). The header is damaged or from an unknown Merlin version"
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


def _counter_depth_text(fields: list[str]) -> str | None:
    stripped = [f.strip().strip("\x00").strip() for f in fields]
    if "MQ1A" in stripped:
        i = stripped.index("MQ1A")
        return stripped[i + 3] if i + 3 < len(stripped) else None
    rest = [f for f in stripped if f]
    return rest[-1] if rest else None


def _counter_depth(fields: list[str]) -> int | None:
    """The counter depth of a header's fields, or ``None`` when absent or not an integer."""
    text = _counter_depth_text(fields)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def raw_payload_bytes(counter_depth: int, n_pixels: int) -> int:
    """Bytes of one raw-mode (``R64``) frame of ``n_pixels`` pixels after its header.

    Parameters
    ----------
    counter_depth
        1, 6, 12 or 24.
    n_pixels
        Pixels of the decoded frame.

    Returns
    -------
    int
        ``n_pixels * slot / 8`` (twice that for 24 bits: two 12-bit sub-frames).
    """
    slot, _ = RAW_DEPTHS[counter_depth]
    subframes = 2 if counter_depth == 24 else 1
    return subframes * n_pixels * slot // 8


def _unswap(payload: np.ndarray, slot: int) -> np.ndarray:
    """Pixels of big-endian 64-bit words, first pixel in the least significant slot."""
    n = payload.shape[0]
    words = payload.reshape(n, -1, 8)
    if slot == 1:
        return np.unpackbits(words[:, :, ::-1], axis=-1, bitorder="little").reshape(n, -1)
    if slot == 8:
        return words[:, :, ::-1].reshape(n, -1)
    values = words.view(">u2")  # slot == 16: four big-endian 16-bit values per word
    return values[:, :, ::-1].reshape(n, -1)


def decode_raw_frames(
    payload: np.ndarray, counter_depth: int, *, out: np.ndarray, quad: bool = False
) -> np.ndarray:
    """Decode raw-mode (``R64``) frames into ``out``.

    Parameters
    ----------
    payload
        ``(n, raw_payload_bytes(...))`` uint8: the frames' bytes after their headers.
    counter_depth
        1, 6, 12 or 24.
    out
        ``(n, k_r, k_c)`` array of the decoded dtype (:data:`RAW_DEPTHS`), filled.
    quad
        A 2x2 quad (1, 6 or 12 bits): each raw row ``j`` of ``4 s`` pixels is
        ``[chip 4 row, chip 3 row, chip 2 row, chip 1 row]``: chips 1 and 2
        give row ``j`` of the left and right top quadrants, chips 3 and 4 row
        ``2 s - 1 - j`` of the left and right bottom quadrants, reversed.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    n = out.shape[0]
    flat = out.reshape(n, -1)
    slot, _ = RAW_DEPTHS[counter_depth]
    if quad:
        half = out.shape[1] // 2
        rows = _unswap(payload, slot).reshape(n, half, 4, half)  # (frame, raw row, chip, x)
        out[:, :half, :half] = rows[:, :, 3]
        out[:, :half, half:] = rows[:, :, 2]
        out[:, half:, :half] = rows[:, ::-1, 1, ::-1]
        out[:, half:, half:] = rows[:, ::-1, 0, ::-1]
        return out
    if counter_depth == 24:
        half = payload.shape[1] // 2
        flat[...] = _unswap(payload[:, :half], slot)  # the 12 most significant bits
        flat <<= 12
        flat += _unswap(payload[:, half:], slot)
    else:
        flat[...] = _unswap(payload, slot)
    return out


def raw_frame_layout(
    header: dict[str, Any], depth: int, height: int, width: int, where: str
) -> tuple[int, int, bool]:
    """The decoded frame shape of a raw-mode (``R64``) frame, and whether it is a 2x2 quad.

    Parameters
    ----------
    header
        :func:`parse_mib_header` of the frame.
    depth
        Its counter depth (1, 6, 12 or 24).
    height, width
        The header's frame size.
    where
        The file or stream, for messages.

    Raises
    ------
    FormatError
        For multi-chip layouts other than 2x2 quads of 1, 6 or 12 bits, and
        sizes that do not fill whole 64-bit words.
    """
    chips = int(header["n_chips"])
    layout = str(header.get("sensor_layout", "")).strip().rstrip("G")
    quad = chips == 4 and layout == "2x2"
    if chips != 1 and not (quad and depth != 24):
        raise FormatError(
            f"{where} holds raw-mode (R64) {depth}-bit frames of a {chips}-chip "
            f"sensor (layout {header.get('sensor_layout')!r}); only single chips and "
            "2x2 quads of 1, 6 or 12 bits are decoded (the chips' rows are interleaved in "
            "an order known only for those). Record in processed mode (U08/U16/U32), "
            "which stores assembled frames"
        )
    if quad:
        if width != 4 * height:
            raise FormatError(
                f"the MQ1 header of {where} declares a raw 2x2 quad frame of "
                f"{width} x {height} (width x height); expected the four chips' rows side by "
                f"side, a width of 4 x the chip height ({4 * height})"
            )
        if (height * RAW_DEPTHS[depth][0]) % 64:
            raise FormatError(
                f"the MQ1 header of {where} declares raw {depth}-bit quad chips "
                f"{height} pixels wide, whose rows do not fill whole 64-bit words; the "
                "header is damaged"
            )
        height, width = 2 * height, 2 * height
    if depth == 24:
        if width % 2:
            raise FormatError(
                f"the MQ1 header of {where} declares a 24-bit raw frame of odd "
                f"width {width}; expected twice the frame width (two 12-bit sub-frames)"
            )
        width //= 2
    slot = RAW_DEPTHS[depth][0]
    if (height * width * slot) % 64:
        raise FormatError(
            f"the MQ1 header of {where} declares a raw {depth}-bit frame of "
            f"{height} x {width} pixels, which does not fill whole 64-bit words of "
            f"{64 // slot} pixels; the header is damaged"
        )
    return height, width, quad


def parse_hdr(path: Path) -> dict[str, str]:
    """Parse a Merlin ``.hdr`` acquisition header (``key:<TAB>value`` lines)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise FormatError(f"cannot read Merlin header {str(path)!r}: {exc}") from exc
    return parse_hdr_text(text)


def parse_hdr_text(text: str) -> dict[str, str]:
    """Parse a Merlin acquisition header's text (a ``.hdr`` file, the TCP stream's first)."""
    out: dict[str, str] = {}
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


_FRAMES_IN_ACQUISITION = "Frames in Acquisition (Number)"
_FRAMES_PER_TRIGGER = "Frames per Trigger (Number)"


def _mib_beside(hdr: Path) -> tuple[Path, str]:
    """The ``.mib`` file an acquisition header describes: same stem, else the only one."""
    same = hdr.with_suffix(".mib")
    if same.is_file():
        return (
            same.resolve(),
            f"entry: the acquisition header {hdr.name!r}; frames from {same.name!r}",
        )
    candidates = sorted(p for p in hdr.parent.glob(f"{hdr.stem}*.mib") if p.is_file())
    if len(candidates) == 1:
        return candidates[0].resolve(), (
            f"entry: the acquisition header {hdr.name!r}; frames from {candidates[0].name!r}, "
            "the only .mib file of that name"
        )
    found = [p.name for p in candidates[:6]]
    raise SourceNotFoundError(
        f"the Merlin header {str(hdr)!r} was given, but no frames file {same.name!r} is beside "
        f"it"
        + (f"; several match its name: {found}; open the one to read" if found else "")
        + ". Copy the .mib file next to its .hdr, or open the .mib itself"
    )


def _int_field(hdr: dict[str, str] | None, key: str) -> int | None:
    if hdr is None:
        return None
    try:
        return int(str(hdr.get(key, "")).split()[0])
    except (ValueError, IndexError):
        return None


def _trigger_hint(hdr: dict[str, str] | None, frames: int) -> str | None:
    """What the header's trigger settings suggest for the scan shape (never applied silently)."""
    per = _int_field(hdr, _FRAMES_PER_TRIGGER)
    if per is None or not 1 < per < frames or frames % per:
        return None
    return (
        f"The .hdr records {per} frames per trigger: if each trigger started a scan row, the "
        f"scan is scan_shape=({frames // per}, {per})"
    )


def _hdr_checks(hdr: dict[str, str] | None, n_frames: int, path: Path) -> list[str]:
    """Notes where the header disagrees with the frames file (an acquisition cut short)."""
    declared = _int_field(hdr, _FRAMES_IN_ACQUISITION)
    if declared is None or declared == n_frames:
        return []
    return [
        f"the .hdr declares {declared} frames in the acquisition, but {path.name!r} holds "
        f"{n_frames}" + (" (the acquisition stopped early?)" if n_frames < declared else "")
    ]


class MerlinSource(FrameSource):
    """A Merlin ``.mib`` file of processed-mode frames.

    Parameters
    ----------
    path
        The ``.mib`` file, or its ``.hdr`` acquisition header (the ``.mib``
        of the same name beside it is read; recorded as a note).
    scan_shape
        ``(rows, cols)``; ``"square"`` to assume a square scan (recorded as
        a note); ``None`` to read a JSON sidecar (``x.mib.json`` or
        ``x.json``).  The ``.hdr`` file does not set the scan shape (its
        "Frames per Trigger" means a scan row only with line triggering); when
        no shape is given, the error says the shape it suggests.
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
        given = check_exists(path, what="Merlin .mib file")
        self._entry_note: str | None = None
        if given.suffix.lower() == ".hdr":  # users point at the acquisition header
            given, self._entry_note = _mib_beside(given)
        self._path = given
        size = self._path.stat().st_size
        with open(self._path, "rb") as f:
            probe = f.read(_PROBE_BYTES)
        self._header = parse_mib_header(probe, self._path)
        head = int(self._header["header_bytes"])
        rows, cols = int(self._header["height"]), int(self._header["width"])
        if head < 1 or rows < 1 or cols < 1:
            raise FormatError(
                f"{str(self._path)!r}: its MQ1 header declares a {head}-byte header and "
                f"{rows} x {cols} pixel frames; expected positive sizes. The header is damaged"
            )
        self._first_header = probe[:head]
        self._counter_depth: int | None = None
        self._quad = False
        if self._header["pixel_depth"] == "R64":
            self._counter_depth = int(self._header["counter_depth"])
            rows, cols = self._raw_frame_shape(rows, cols)
            self._file_dtype = np.dtype(RAW_DEPTHS[self._counter_depth][1])
            payload = raw_payload_bytes(self._counter_depth, rows * cols)
            layout = (
                f"{head}-byte header + {payload} bytes of raw {self._counter_depth}-bit counters"
            )
        else:
            self._file_dtype = np.dtype(MIB_DTYPES[self._header["pixel_depth"]])
            payload = rows * cols * self._file_dtype.itemsize
            layout = f"{head}-byte header + {rows} x {cols} x {self._file_dtype.itemsize} bytes"
        record = head + payload
        if size < record or size % record:
            raise FormatError(
                f"{str(self._path)!r} holds {size} bytes but its frame records are {record} bytes "
                f"({layout}), which makes {size / record:.4g} frames, not a whole number; the "
                "file is truncated (an interrupted acquisition?) or its records differ in size"
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
        try:
            self._set_frames(
                n_frames=n_frames,
                frame_shape=(rows, cols),
                dtype=self._file_dtype,
                scan_shape=scan_shape,
                path=self._path,
                frame_offset=frame_offset,
            )
        except ScanShapeError as exc:
            hint = _trigger_hint(self._hdr, n_frames - frame_offset)
            if hint is None:
                raise
            raise ScanShapeError(f"{exc}. {hint}") from exc
        self._hdr_notes = _hdr_checks(self._hdr, n_frames, self._path)
        self._raw: RawSource | None = None
        self._handle_file: PositionalFile | None = None
        if self._counter_depth is None:
            self._raw = RawSource(
                self._path,
                dtype=self._file_dtype,
                frame_shape=(rows, cols),
                scan_shape=self._scan.shape,
                frame_header_bytes=head,
                frame_offset=frame_offset,
            )

    def _raw_frame_shape(self, height: int, width: int) -> tuple[int, int]:
        """The decoded frame shape of a raw-mode header, checked against the 64-bit words."""
        assert self._counter_depth is not None
        height, width, self._quad = raw_frame_layout(
            self._header, self._counter_depth, height, width, f"{str(self._path)!r}"
        )
        return height, width

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
            "stored_dtype": (
                self._file_dtype.str
                if self._counter_depth is None
                else f"R64 (raw, {self._counter_depth}-bit counters)"
            ),
            "raw_mode": self._counter_depth is not None,
            "counter_depth": self._header.get("counter_depth"),
            "record_bytes": self._record,
            "last_sequence_number": self._last_sequence,
            "quad": int(self._header["n_chips"]) == 4,
            "hdr_file": str(self._hdr_path) if self._hdr_path is not None else None,
            "hdr": dict(self._hdr) if self._hdr is not None else None,
            **self.scan_metadata(),
        }

    @property
    def notes(self) -> list[str]:
        """The scan-shape choice, the entry used and where the ``.hdr`` disagrees."""
        entry = [self._entry_note] if self._entry_note else []
        return [*entry, *super().notes, *self._hdr_notes]

    @property
    def calibration(self) -> Calibration | None:
        """Calibration from a JSON sidecar next to the file, if any."""
        return sidecar_calibration(self._path)

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` without their headers, in native byte order.

        Raw-mode frames are decoded (:func:`decode_raw_frames`); each record's
        header is checked to start with ``MQ1,``.
        """
        if self._raw is not None:
            return self._raw.read_frames(start, stop, out=out)
        if not 0 <= start < stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        n = stop - start
        shape = (n, *self._frame_shape)
        if out is None or out.shape != shape or out.dtype != self._dtype:
            out = np.empty(shape, dtype=self._dtype)
        records = np.empty((n, self._record), dtype=np.uint8)
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        self._handle_file.readinto(
            start * self._record, records, what=f"raw-mode frame records {start}..{stop - 1}"
        )
        head = int(self._header["header_bytes"])
        bad = np.flatnonzero((records[:, :4] != np.frombuffer(b"MQ1,", np.uint8)).any(axis=1))
        if bad.size:
            raise CorruptChunkError(
                f"{str(self._path)!r}: the record of frame {start + int(bad[0])} (byte "
                f"{(start + int(bad[0])) * self._record}) does not start with an 'MQ1,' header; "
                f"expected records of {self._record} bytes. The headers differ in size between "
                "frames or the file is damaged"
            )
        assert self._counter_depth is not None
        return decode_raw_frames(records[:, head:], self._counter_depth, out=out, quad=self._quad)

    def close(self) -> None:
        """Drop the memory map."""
        if self._raw is not None:
            self._raw.close()
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None


def _sequence(header: bytes) -> int | None:
    parts = header[:64].split(b",")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None
