"""PNDetector pnCCD ``.frms6`` acquisitions: a ``.hdr`` and numbered ``.frms6`` files.

An acquisition ``name`` is ``name.hdr`` (INI text; section ``[measurementInfo]``
with ``darkframes``, ``signalframes``, ``stemimagesize = AxB``, ``readoutmode
= "bin: N, windowing: I x J"``, ``dwelltimemicroseconds``, ``gain``) and
``name_000.frms6`` (the dark frames), ``name_001.frms6``... (the signal
frames, in order).  Each ``.frms6`` file (little endian):

====== ====== ==============================================================
0      u16    header size, 1024
2      u16    frame header size, 64
7      u8     version, 6
88     u16    width (columns as read out), 90: height (rows)
1020   u32    frames in the file (0 in older files: from the file's size)
1024   ...    per frame: a 64-byte frame header, then ``height x width`` u16
====== ====== ==============================================================

The camera reads its two halves out side by side: a frame as stored is
``height`` rows of ``width`` columns, the left half the detector's top
``height`` rows and the right half its bottom rows, upside down and mirrored.
Frames are returned unfolded, ``(2 * height, width // 2)``: row ``y < h`` is
stored row ``y``, left half; row ``h + j`` is stored row ``h - 1 - j``, right
half read backwards.  A binned readout (``bin: N``) is returned as read, each
row covering ``N`` detector rows (recorded; nothing is resampled).

The files are exactly ``name_NNN.frms6`` (another acquisition ``name_2`` in the
same folder is not mixed in), numbered from 000 without a gap (a missing file
is refused: the frames after it would shift).  The ``.hdr``'s ``signalframes``
must equal the frames the files hold unless ``scan_shape=`` is given (then
noted); a ``darkframes`` that differs, bytes after a file's announced frames
and a binned readout are noted; a file recording no frame count must hold
whole frames.

The scan shape is the ``.hdr``'s ``stemimagesize`` (``A x B`` read as ``A``
rows of ``B`` columns, recorded), unless ``scan_shape=`` is given.

Corrections are applied only when asked (``corrections=``): ``"dark"``
subtracts the mean of the dark frames of ``name_000.frms6``; ``"gain"``
multiplies by ``gain_map=`` (a ``.npy`` array, or a MATLAB ``.mat`` holding
one array, of the unfolded frame's shape).  The values are then ``float32``
and the metadata records what was applied (the dark frames' count and file,
the gain map's path and SHA-256); a dark file present but not asked for is
noted.
"""

from __future__ import annotations

import configparser
import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import (
    FormatError,
    ParameterError,
    ScanShapeError,
    ShapeError,
    SourceNotFoundError,
)
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile, PositionalFiles
from .references import apply_dark_gain, asked_corrections, load_reference

__all__ = ["Frms6Source", "read_frms6_header", "sniff", "unfold"]

_HEADER = np.dtype(
    [
        ("header_size", "<u2"),
        ("frame_header_size", "<u2"),
        ("padding", "V3"),
        ("version", "u1"),
        ("comment_1", "V80"),
        ("width", "<u2"),
        ("height", "<u2"),
        ("comment_2", "V928"),
        ("num_frames", "<u4"),
    ]
)
_FRAME_HEADER = 64
_READOUT = re.compile(r'^"?\s*bin:\s*(\d+)\s*,\s*windowing:\s*(\d+)\s*x\s*(\d+)\s*"?$')
_CORRECTIONS = ("dark", "gain")
#: Dark frames summed per piece when their mean is asked for (bounded memory).
_DARK_PIECE_BYTES = 64 << 20


def sniff(path: Path, head: bytes) -> bool:
    """An FRMS6 file header (sizes 1024 and 64, version 6), or a .hdr with [measurementInfo]."""
    if len(head) >= 8 and head[:4] == b"\x00\x04\x40\x00" and head[7] == 6:
        return True
    return b"[measurementInfo]" in head[:4096]


def read_frms6_header(path: Path) -> dict[str, int]:
    """The file header of one ``.frms6`` file, checked."""
    with open(path, "rb") as f:
        raw = f.read(_HEADER.itemsize)
    if len(raw) < _HEADER.itemsize:
        raise FormatError(f"{str(path)!r} is shorter than the 1024-byte FRMS6 file header")
    h = np.frombuffer(raw, dtype=_HEADER, count=1)[0]
    out = {k: int(h[k]) for k in ("header_size", "frame_header_size", "version", "width", "height")}
    out["num_frames"] = int(h["num_frames"])
    if (out["header_size"], out["frame_header_size"], out["version"]) != (1024, 64, 6):
        raise FormatError(
            f"{str(path)!r} is not an FRMS6 file (header size {out['header_size']}, frame "
            f"header size {out['frame_header_size']}, version {out['version']}; expected 1024, "
            "64 and 6)"
        )
    if out["width"] < 2 or out["width"] % 2 or out["height"] < 1:
        raise FormatError(
            f"{str(path)!r}: frames of {out['height']} x {out['width']} as read out; the width "
            "must be even (two halves side by side)"
        )
    frame = _FRAME_HEADER + out["width"] * out["height"] * 2
    body = path_size(path) - 1024
    if out["num_frames"] == 0:  # older files: from the size
        if body % frame:
            raise FormatError(
                f"{str(path)!r} records no frame count and holds {body} bytes of frames, not a "
                f"whole number of {frame}-byte frames: a partial last frame (truncated)"
            )
        out["num_frames"] = body // frame
    out["extra_bytes"] = max(0, body - out["num_frames"] * frame)
    if body < out["num_frames"] * frame:
        raise FormatError(
            f"{str(path)!r} holds {body} bytes of frames, fewer than the {out['num_frames']} "
            f"frames of {frame} bytes its header announces: truncated"
        )
    return out


def unfold(stored: np.ndarray) -> np.ndarray:
    """``(n, h, w)`` frames as read out to ``(n, 2h, w // 2)`` (see the module docstring)."""
    n, h, w = stored.shape
    half = w // 2
    out = np.empty((n, 2 * h, half), dtype=stored.dtype)
    out[:, :h] = stored[:, :, :half]
    out[:, h:] = stored[:, ::-1, half:][:, :, ::-1]
    return out


def _acquisition_files(base: Path) -> list[Path]:
    """``<base>_NNN.frms6`` beside ``base``, in order, numbered 000, 001... without a gap.

    (Without a ``_000`` the list is returned as found: the caller names the missing darks.)
    """
    pattern = re.compile(re.escape(base.name) + r"_(\d{3,})")
    numbered = sorted(
        (int(m.group(1)), p)
        for p in base.parent.glob(f"{glob.escape(base.name)}_*.frms6")
        if (m := pattern.fullmatch(p.stem))
    )
    numbers = [n for n, _ in numbered]
    if numbers and numbers[0] == 0 and numbers != list(range(len(numbers))):
        raise SourceNotFoundError(
            f"the files of the FRMS6 acquisition {str(base)!r} are numbered {numbers}: "
            "they must run 000, 001, ... without a gap or a repeat (a file is missing, and "
            "the frames after it would shift)"
        )
    return [p for _, p in numbered]


def _base(path: Path) -> Path:
    if path.suffix == ".hdr":
        return path.with_suffix("")
    if path.suffix == ".frms6":
        return path.with_name(re.sub(r"_\d+$", "", path.stem))
    raise FormatError(f"{str(path)!r}: an FRMS6 acquisition is opened by its .hdr or a .frms6 file")


class Frms6Source(FrameSource):
    """A pnCCD FRMS6 acquisition (see the module docstring).

    Parameters
    ----------
    path
        The ``.hdr`` or any of the acquisition's ``.frms6`` files.
    scan_shape
        ``(rows, cols)`` instead of the ``.hdr``'s ``stemimagesize``.
    frame_offset
        Leading signal frames to skip.
    corrections
        Among ``"dark"`` (the mean dark frame subtracted) and ``"gain"``
        (times ``gain_map``); the values become ``float32``.  Default: none.
    gain_map
        The gain map for ``"gain"``: a ``.npy`` array or a ``.mat`` holding one
        array, of the unfolded frame's shape.
    """

    format: ClassVar[str] = "frms6"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
        corrections: Sequence[str] = (),
        gain_map: str | os.PathLike[str] | None = None,
    ) -> None:
        self._handle_files: PositionalFiles | None = None
        given = check_exists(path)
        base = _base(given)
        self._path = Path(f"{base}.hdr")
        if not self._path.is_file():
            raise SourceNotFoundError(
                f"the FRMS6 acquisition {str(base)!r} has no {self._path.name!r} beside "
                f"{str(given)!r}; it holds the dark frame count and the scan shape"
            )
        self._hdr = self._read_hdr()
        files = _acquisition_files(base)
        if not files or not files[0].stem.endswith("_000"):
            raise SourceNotFoundError(
                f"the FRMS6 acquisition {str(base)!r} has no {base.name}_000.frms6 (the dark "
                f"frames) beside its .hdr; found {[p.name for p in files]}"
            )
        self._dark_file = files[0]
        self._files = files[1:]
        if not self._files:
            raise SourceNotFoundError(
                f"the FRMS6 acquisition {str(base)!r} has no signal files "
                f"({base.name}_001.frms6...)"
            )
        headers = [read_frms6_header(p) for p in files]
        first = headers[0]
        for p, h in zip(files, headers, strict=True):
            if (h["width"], h["height"]) != (first["width"], first["height"]):
                raise FormatError(
                    f"{str(p)!r} holds {h['height']} x {h['width']} frames, {files[0].name!r} "
                    f"{first['height']} x {first['width']}: not one acquisition"
                )
        self._stored_shape = (first["height"], first["width"])
        counts = [h["num_frames"] for h in headers[1:]]
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        n_signal = int(self._starts[-1])
        announced = self._hdr.get("signalframes")
        self._open_notes: list[str] = []
        if announced is not None and announced != n_signal:
            if scan_shape is None:
                raise FormatError(
                    f"the .hdr of {str(base)!r} announces {announced} signal frames; its "
                    f"{len(self._files)} signal files hold {n_signal}: a file is missing, "
                    "damaged or extra. Pass scan_shape= to open the frames the files hold"
                )
            self._open_notes.append(
                f"the .hdr announces {announced} signal frames; the files hold {n_signal} "
                "(opened as the files hold them, with the scan_shape= given)"
            )
        if self._hdr.get("binning", 1) > 1:
            self._open_notes.append(
                f"read out binned (bin: {self._hdr['binning']}): each frame row covers "
                f"{self._hdr['binning']} detector rows, returned as read (not resampled)"
            )
        self._dark_count = headers[0]["num_frames"]
        dark_announced = self._hdr.get("darkframes")
        if dark_announced is not None and dark_announced != self._dark_count:
            self._open_notes.append(
                f"the .hdr announces {dark_announced} dark frames; {self._dark_file.name!r} "
                f"holds {self._dark_count}"
            )
        for p, h in zip(files, headers, strict=True):
            if h["extra_bytes"]:
                self._open_notes.append(
                    f"{p.name!r} holds {h['extra_bytes']} bytes after the {h['num_frames']} "
                    "frames its header announces; they are not read"
                )
        asked = asked_corrections(corrections, _CORRECTIONS, fmt="FRMS6")
        frame_shape = (2 * first["height"], first["width"] // 2)
        self._corrections: dict[str, Any] = {}
        if "dark" in asked:
            if self._dark_count < 1:
                raise ShapeError(f"{str(self._dark_file)!r} holds no dark frames to subtract")
            self._corrections["dark"] = self._mean_dark(frame_shape)
        elif self._dark_count:
            self._open_notes.append(
                f"{self._dark_count} dark frames in {self._dark_file.name!r} were not subtracted "
                "(pass corrections=('dark',) to subtract their mean)"
            )
        self._gain_record: dict[str, str] | None = None
        if "gain" in asked:
            gain, record = load_reference(gain_map, frame_shape, kind="gain")
            self._corrections["gain"] = gain
            self._gain_record = {"path": record["path"], "sha256": record["sha256"]}
        elif gain_map is not None:
            raise ParameterError(
                "gain_map= was given without corrections=('gain',); pass both to apply it"
            )
        stem = self._hdr.get("stemimagesize")
        scan: Sequence[int] | str | None = scan_shape
        how = None
        if scan_shape is None and stem is not None:
            scan, how = stem, f"the .hdr's stemimagesize {stem[0]}x{stem[1]} (rows x cols)"
        if scan is None:
            raise ScanShapeError(
                f"{str(self._path)!r} records no stemimagesize; pass scan_shape=(rows, cols)"
            )
        self._set_frames(
            n_frames=n_signal,
            frame_shape=frame_shape,
            dtype=np.dtype(np.float32) if self._corrections else np.dtype("<u2"),
            scan_shape=scan,
            path=None,
            frame_offset=frame_offset,
            scan_shape_from=how,
        )

    def _mean_dark(self, frame_shape: tuple[int, int]) -> np.ndarray:
        """The mean of the dark frames, summed in float64 a bounded piece at a time."""
        total = np.zeros(frame_shape, dtype=np.float64)
        step = max(1, _DARK_PIECE_BYTES // (2 * frame_shape[0] * frame_shape[1]))
        for a in range(0, self._dark_count, step):
            b = min(self._dark_count, a + step)
            total += self._read_file(self._dark_file, a, b).sum(axis=0, dtype=np.float64)
        return (total / self._dark_count).astype(np.float32)

    def _read_hdr(self) -> dict[str, Any]:
        config = configparser.ConfigParser(interpolation=None)
        try:
            config.read_string(self._path.read_text(errors="replace"))
        except configparser.Error as exc:
            raise FormatError(f"{str(self._path)!r} is not an INI file: {exc}") from exc
        if "measurementInfo" not in config:
            raise FormatError(
                f"{str(self._path)!r} has no [measurementInfo] section; sections: "
                f"{config.sections()}"
            )
        info = dict(config["measurementInfo"])
        out: dict[str, Any] = {"raw": info}
        for key in ("darkframes", "signalframes", "dwelltimemicroseconds", "gain"):
            if key in info:
                try:
                    out[key] = int(info[key])
                except ValueError as exc:
                    raise FormatError(
                        f"{str(self._path)!r}: {key} = {info[key]!r} is not an integer"
                    ) from exc
        if "stemimagesize" in info:
            parts = info["stemimagesize"].strip().strip('"').lower().split("x")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise FormatError(
                    f"{str(self._path)!r}: stemimagesize = {info['stemimagesize']!r}; expected AxB"
                )
            out["stemimagesize"] = (int(parts[0]), int(parts[1]))
        if "readoutmode" in info:
            match = _READOUT.match(info["readoutmode"].strip())
            if match is None:
                raise FormatError(
                    f"{str(self._path)!r}: readoutmode = {info['readoutmode']!r}; expected "
                    '"bin: N, windowing: I x J"'
                )
            out["binning"] = int(match.group(1))
            out["windowing"] = (int(match.group(2)), int(match.group(3)))
        return out

    # -- reading ------------------------------------------------------------------------
    def _file(self, path: Path) -> PositionalFile:
        if self._handle_files is None:
            self._handle_files = PositionalFiles()
        return self._handle_files.get(path)

    def _read_file(self, path: Path, start: int, stop: int) -> np.ndarray:
        """Frames ``[start, stop)`` of one file, unfolded, ``uint16``."""
        h, w = self._stored_shape
        frame = _FRAME_HEADER + h * w * 2
        span = np.empty((stop - start) * frame, dtype=np.uint8)
        if stop > start:
            self._file(path).readinto(
                1024 + start * frame, span, what=f"frames [{start}, {stop}) of {path.name}"
            )
        stored = span.reshape(stop - start, frame)[:, _FRAME_HEADER:].view("<u2")
        return unfold(stored.reshape(stop - start, h, w).astype(np.uint16, copy=False))

    @property
    def streams_blocks(self) -> bool:
        """Any frames read for the cost of their own bytes (a pass streams them in pieces)."""
        return True

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Signal frames ``[start, stop)`` (absolute), unfolded, corrected when asked."""
        target = self._frames_target(start, stop, out)
        pos = start
        while pos < stop:
            i = int(np.searchsorted(self._starts, pos, "right")) - 1
            end = min(stop, int(self._starts[i + 1]))
            first = int(self._starts[i])
            target[pos - start : end - start] = self._read_file(
                self._files[i], pos - first, end - first
            )
            pos = end
        apply_dark_gain(target, self._corrections)
        return self._delivered(target, out)

    # -- description ----------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The ``.hdr``."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """The ``.hdr``, the ``.frms6`` files (and a gain map applied), sizes, header digest."""
        paths = [self._path, self._dark_file, *self._files]
        if self._gain_record is not None:
            paths.append(Path(self._gain_record["path"]))
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(p) for p in paths),
            file_sizes=tuple(path_size(p) for p in paths),
            header_sha256=header_digest(
                self._path.read_bytes(), sorted(self._corrections), self._gain_record
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """The ``.hdr``'s measurement info, the stored frame shape, the corrections applied."""
        applied = []
        if "dark" in self._corrections:
            applied.append(
                {"kind": "dark", "frames": self._dark_count, "file": str(self._dark_file)}
            )
        if self._gain_record is not None:
            applied.append({"kind": "gain", **self._gain_record})
        return {
            "measurement_info": self._hdr["raw"],
            "readout_binning": self._hdr.get("binning", 1),
            "stored_frame_shape": list(self._stored_shape),
            "files": [str(p) for p in self._files],
            "dark_frames": self._dark_count,
            "corrections": applied,
            **self.scan_metadata(),
        }

    def close(self) -> None:
        """Close the files."""
        if self._handle_files is not None:
            self._handle_files.close()
