"""Norpix StreamPix ``.seq`` files (as Direct Electron cameras record them).

Layout (little endian): a header, then frames at a fixed stride.  The header
fields this reader uses (byte offsets):

====== ======== =======================================================
0      u32      magic ``0xFEED``
4      24 bytes name, UTF-16LE ``"Norpix seq"``
28     i32      version (5 and later: StreamPix 6, images from byte 8192;
                earlier: from byte 1024)
32     i32      header size
548    u32 x 9  width, height, bit depth, real bit depth, image bytes,
                image format, allocated frames, origin, true image size
                (the stride from one image to the next: the image, its
                timestamp and padding)
584    f64      suggested frame rate (recorded)
620    u32      compression format (0: none; others are refused)
====== ======== =======================================================

Frames are monochrome (image format 100; colour and Bayer formats are refused)
``uint8/16/32`` images of ``height`` rows of ``width`` columns; the number of
frames is what the file holds (whole strides after the image offset; a
trailing partial frame is ignored and noted, and so is a count that differs
from the header's allocated frames).  The header records
no scan shape: ``scan_shape=``, or a JSON sidecar, says it.

Reference images beside the file, found by name: ``<file>.dark.mrc`` and
``<file>.gain.mrc`` (MRC images of the detector's shape).  They are applied
only when asked (``corrections=("dark", "gain")``): the values become
``float32`` ``(raw - dark) * gain`` (``float64`` for 32-bit frames, which
``float32`` would round above 2**24), and the metadata and notes record which
references were applied, with their paths and SHA-256; references present
but not asked for are noted, never applied.  The DE bad-pixel map
(``<file>.Config.Metadata.xml``, see :mod:`quantem_flow.io.bad_pixels`) is
applied only when asked too (``"bad_pixels"``: each bad pixel replaced by the
mean of its good 3 x 3 neighbours, after dark and gain; the map of the frames'
size is used, a cropped or binned readout's is refused), recorded with its
path, SHA-256 and pixel count.  DE's binary ``<file>.metadata`` is recorded
(path and SHA-256) and not interpreted: its layout differs between DE
software versions and is not published, and the scan shape is not in it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import (
    DtypeError,
    FormatError,
    ShapeError,
    SourceNotFoundError,
    UnsupportedOperationError,
)
from .bad_pixels import BadPixelPatch, load_bad_pixel_map
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile
from .references import apply_dark_gain, asked_corrections, file_sha256

__all__ = ["SEQ_MAGIC", "SeqSource", "parse_seq_header", "sniff"]

#: The first four bytes of every SEQ file (little-endian ``0xFEED``).
SEQ_MAGIC = 0xFEED
_NAME = "Norpix seq"
#: (name, struct code) of the header fields, in file order from byte 0.
_FIELDS = (
    ("magic", "L"),
    ("name", "24s"),
    ("version", "l"),
    ("header_size", "l"),
    ("description", "512s"),
    ("width", "L"),
    ("height", "L"),
    ("bit_depth", "L"),
    ("bit_depth_real", "L"),
    ("image_size_bytes", "L"),
    ("image_format", "L"),
    ("allocated_frames", "L"),
    ("origin", "L"),
    ("true_image_size", "L"),
    ("suggested_frame_rate", "d"),
    ("description_format", "l"),
    ("reference_frame", "L"),
    ("fixed_size", "L"),
    ("flags", "L"),
    ("bayer_pattern", "l"),
    ("time_offset_us", "l"),
    ("extended_header_size", "l"),
    ("compression_format", "L"),
)
_HEADER = struct.Struct("<" + "".join(code for _, code in _FIELDS))
#: References beside the file, applied (in this order) only when asked.
_REFERENCES = ("dark", "gain")
_CORRECTIONS = (*_REFERENCES, "bad_pixels")


#: Norpix's image format of monochrome images (colour and Bayer formats are refused).
_MONO = 100


def sniff(path: Path, head: bytes) -> bool:
    """The magic ``0xFEED`` and the UTF-16 name ``Norpix seq`` at byte 4."""
    if len(head) < 28 or struct.unpack_from("<L", head)[0] != SEQ_MAGIC:
        return False
    return head[4:24].decode("utf-16-le", errors="replace").startswith(_NAME)


def _text(raw: bytes) -> str:
    return raw.decode("utf-16-le", errors="replace").split("\x00", 1)[0]


def parse_seq_header(raw: bytes, path: Path) -> dict[str, Any]:
    """The header's fields, checked (see the module docstring)."""
    if len(raw) < _HEADER.size:
        raise FormatError(
            f"{str(path)!r} has {len(raw)} bytes, fewer than the {_HEADER.size} of a SEQ header"
        )
    values = dict(zip((n for n, _ in _FIELDS), _HEADER.unpack_from(raw), strict=True))
    values["name"] = _text(values["name"])
    values["description"] = _text(values["description"])
    where = str(path)
    if values["magic"] != SEQ_MAGIC or not values["name"].startswith(_NAME):
        raise FormatError(
            f"{where!r} is not a Norpix SEQ file (magic {values['magic']:#x}, name "
            f"{values['name']!r}; expected 0xfeed and 'Norpix seq')"
        )
    width, height, depth = values["width"], values["height"], values["bit_depth"]
    if width < 1 or height < 1 or depth not in (8, 16, 32):
        raise FormatError(
            f"{where!r}: the header gives {height} x {width} images of {depth} bits; expected "
            "positive sizes and 8, 16 or 32 bits"
        )
    image = width * height * depth // 8
    if values["image_size_bytes"] != image or values["true_image_size"] < image:
        raise FormatError(
            f"{where!r}: the header's image bytes ({values['image_size_bytes']}) and stride "
            f"({values['true_image_size']}) do not fit {height} x {width} x {depth} bits "
            f"({image} bytes); the header is damaged"
        )
    if values["image_format"] != _MONO:
        raise UnsupportedOperationError(
            f"{where!r} holds images of Norpix image format {values['image_format']} (colour "
            f"or Bayer); this reader reads monochrome ({_MONO}) sequences, as detectors record"
        )
    if values["compression_format"] != 0:
        raise UnsupportedOperationError(
            f"{where!r} holds compressed images (compression format "
            f"{values['compression_format']}); this reader reads uncompressed SEQ only. Export "
            "the sequence uncompressed from StreamPix"
        )
    values["image_offset"] = 8192 if values["version"] >= 5 else 1024
    return values


class SeqSource(FrameSource):
    """A Norpix ``.seq`` file (see the module docstring).

    Parameters
    ----------
    path
        The ``.seq`` file.
    scan_shape
        ``(rows, cols)``, ``"square"``, or ``None`` for a JSON sidecar.
    frame_offset
        Leading frames to skip.
    corrections
        Corrections to apply, among ``"dark"`` and ``"gain"`` (found beside
        the file as ``<file>.dark.mrc``, ``<file>.gain.mrc``) and
        ``"bad_pixels"`` (``<file>.Config.Metadata.xml``); the values become
        ``float32`` (``float64`` for 32-bit frames).  Default: none applied.
    """

    format: ClassVar[str] = "seq"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
        corrections: Sequence[str] = (),
    ) -> None:
        self._path = check_exists(path)
        self._handle_file: PositionalFile | None = None
        with open(self._path, "rb") as f:
            raw = f.read(1024)
        self._header = parse_seq_header(raw, self._path)
        self._raw_header = raw[: _HEADER.size]
        h = self._header
        self._stored_dtype = np.dtype(f"<u{h['bit_depth'] // 8}")
        size = path_size(self._path)
        body = size - h["image_offset"]
        stride = h["true_image_size"]
        n = max(0, body) // stride
        self._open_notes: list[str] = []
        if body < stride:
            raise FormatError(
                f"{str(self._path)!r} holds no whole frame ({size} bytes; images start at byte "
                f"{h['image_offset']} and take {stride} bytes each): truncated"
            )
        if body % stride:
            self._open_notes.append(
                f"{body % stride} bytes after the last whole frame (a partial frame) are ignored"
            )
        if h["allocated_frames"] != n:
            why = "stopped early or truncated" if n < h["allocated_frames"] else "more"
            self._open_notes.append(
                f"the header allocates {h['allocated_frames']} frames; the file holds {n} "
                f"whole frames ({why}); the frames the file holds are read"
            )
        asked = asked_corrections(corrections, _CORRECTIONS, fmt="SEQ")
        self._corrections = self._load_references(asked)
        for kind in _REFERENCES:
            found = self._reference_path(kind)
            if kind not in asked and found.is_file():
                self._open_notes.append(
                    f"a {kind} reference {str(found)!r} is beside the file and was not applied "
                    f"(pass corrections=({kind!r},) to apply it)"
                )
        bad_pixels = Path(f"{self._path}.Config.Metadata.xml")
        self._bad_pixels = str(bad_pixels) if bad_pixels.is_file() else None
        self._patch: BadPixelPatch | None = None
        if "bad_pixels" in asked:
            if self._bad_pixels is None:
                raise SourceNotFoundError(
                    f"corrections asks for 'bad_pixels', but {str(bad_pixels)!r} does not exist; "
                    f"put the DE bad-pixel map beside {str(self._path)!r} or leave it out"
                )
            self._patch = load_bad_pixel_map(bad_pixels, (h["height"], h["width"]))
        elif self._bad_pixels:
            self._open_notes.append(
                f"a bad-pixel map {self._bad_pixels!r} is beside the file and was not applied "
                "(pass corrections=('bad_pixels',) to patch those pixels from their neighbours)"
            )
        de_metadata = Path(f"{self._path}.metadata")
        self._de_metadata = (
            {"path": str(de_metadata), "sha256": file_sha256(de_metadata)}
            if de_metadata.is_file()
            else None
        )
        if self._de_metadata is not None:
            self._open_notes.append(
                f"the DE metadata {str(de_metadata)!r} is recorded (path and SHA-256), not "
                "interpreted: its binary layout differs between DE software versions and is "
                "not published"
            )
        self._set_frames(
            n_frames=n,
            frame_shape=(h["height"], h["width"]),
            dtype=self._corrected_dtype()
            if self._corrections or self._patch
            else self._stored_dtype,
            scan_shape=scan_shape,
            path=self._path,
            frame_offset=frame_offset,
        )

    def _corrected_dtype(self) -> np.dtype[Any]:
        """``float32`` for 8/16-bit frames; ``float64`` for 32-bit ones (exact to 2**53)."""
        return np.dtype(np.float64 if self._stored_dtype.itemsize == 4 else np.float32)

    def _reference_path(self, kind: str) -> Path:
        return Path(f"{self._path}.{kind}.mrc")

    def _load_references(self, asked: Sequence[str]) -> dict[str, tuple[np.ndarray, str, str]]:
        from .mrc import MrcSource

        out: dict[str, tuple[np.ndarray, str, str]] = {}
        shape = (self._header["height"], self._header["width"])
        for kind in _REFERENCES:
            if kind not in asked:
                continue
            ref = self._reference_path(kind)
            if not ref.is_file():
                raise SourceNotFoundError(
                    f"corrections asks for the {kind} reference, but {str(ref)!r} does not "
                    f"exist; put the {kind} MRC beside {str(self._path)!r} or leave {kind!r} out"
                )
            image = np.asarray(MrcSource(ref, scan_shape=(1, 1)).read_frames(0, 1)[0])
            if image.shape != shape:
                raise ShapeError(
                    f"the {kind} reference {str(ref)!r} is {image.shape}, the frames are "
                    f"{shape}; use the reference recorded with this detector setting"
                )
            if not np.all(np.isfinite(image)):
                raise DtypeError(f"the {kind} reference {str(ref)!r} holds non-finite values")
            out[kind] = (image.astype(self._corrected_dtype()), str(ref), file_sha256(ref))
        return out

    # -- reading ------------------------------------------------------------------------
    def _file(self) -> PositionalFile:
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        return self._handle_file

    @property
    def streams_blocks(self) -> bool:
        """Any frames read for the cost of their own bytes."""
        return True

    def frame_bytes(self, start: int, stop: int) -> tuple[Path, int] | None:
        """Frames lie back to back (no timestamps between) only when the stride is the image."""
        h = self._header
        if self._corrections or self._patch or h["true_image_size"] != h["image_size_bytes"]:
            return None
        if not self._stored_dtype.isnative and self._stored_dtype.itemsize > 1:
            return None
        return self._path, h["image_offset"] + start * h["true_image_size"]

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Frames ``[start, stop)`` (absolute), corrected when asked."""
        target = self._frames_target(start, stop, out)
        h = self._header
        kr, kc = self._frame_shape
        n = stop - start
        stride, image = h["true_image_size"], h["image_size_bytes"]
        span = np.empty(n * stride, dtype=np.uint8)
        if n:
            self._file().readinto(
                h["image_offset"] + start * stride, span, what=f"frames [{start}, {stop})"
            )
        raw = span.reshape(n, stride)[:, :image].view(self._stored_dtype).reshape(n, kr, kc)
        target[...] = raw
        apply_dark_gain(target, {k: image for k, (image, _, _) in self._corrections.items()})
        if self._patch is not None:
            self._patch.apply(target)
        return self._delivered(target, out)

    # -- description ----------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The ``.seq`` file."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """The file (and the references applied), sizes, a digest of the header."""
        paths = [str(self._path), *(ref for _, ref, _ in self._corrections.values())]
        if self._patch is not None:
            paths.append(self._patch.path)
        return SourceIdentity(
            format=self.format,
            paths=tuple(paths),
            file_sizes=tuple(path_size(p) for p in paths),
            header_sha256=header_digest(
                self._raw_header,
                sorted((k, v[2]) for k, v in self._corrections.items()),
                None if self._patch is None else self._patch.sha256,
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """The header, the references applied (paths and SHA-256) and the bad-pixel map seen."""
        h = self._header
        return {
            "version": h["version"],
            "description": h["description"],
            "image_offset": h["image_offset"],
            "image_bytes": h["image_size_bytes"],
            "frame_stride_bytes": h["true_image_size"],
            "bit_depth": h["bit_depth"],
            "bit_depth_real": h["bit_depth_real"],
            "allocated_frames": h["allocated_frames"],
            "suggested_frame_rate": h["suggested_frame_rate"],
            "stored_dtype": self._stored_dtype.str,
            "corrections": [
                *(
                    {"kind": k, "path": v[1], "sha256": v[2], "formula": "(raw - dark) * gain"}
                    for k, v in self._corrections.items()
                ),
                *(
                    []
                    if self._patch is None
                    else [
                        {
                            "kind": "bad_pixels",
                            "path": self._patch.path,
                            "sha256": self._patch.sha256,
                            "pixels": self._patch.count,
                            "formula": "mean of the good neighbours in the 3 x 3 window",
                        }
                    ]
                ),
            ],
            "bad_pixel_map": self._bad_pixels,
            "de_metadata": self._de_metadata,
            **self.scan_metadata(),
        }

    def close(self) -> None:
        """Close the file."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
