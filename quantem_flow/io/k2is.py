"""Gatan K2 IS raw acquisitions: a ``.gtg`` and eight sector files ``*_1.bin``... ``*_8.bin``.

Each sector file is a run of blocks of ``40 + 3 * (block pixels) / 2`` bytes
(``0x5758``: 930 x 16 pixels on the camera).  A block's header (big endian):

====== ====== ==============================================================
0      u32    sync ``0xFFFF0055``
16     u32    block count (running in each sector)
20     u16    sector width (256), 22: sector height (1860)
24     u32    frame id
28     u16 x4 first and last pixel column, first and last pixel row of the
              block within its sector (inclusive)
====== ====== ==============================================================

then the block's pixels, row-major, packed 12 bits each (two pixels in three
bytes: ``a = b0 | (b1 & 15) << 8``, ``b = b1 >> 4 | b2 << 4``).  Sector ``s``
(the files in their numeric order) holds columns ``s * width`` to ``(s + 1) *
width`` of the frame: the frame is ``height x 8 * width`` (1860 x 2048).

Recording starts in each sector wherever the camera was, so the sectors are
synchronised here by frame id: a frame is used when every sector holds all of
its blocks, one after the other; the frames before the first such frame and
after the last (partial frames) are left out and noted; a frame id missing
in between is refused (the scan would shift), naming it.  Every block used is
checked (sync word, geometry, its place in its frame) and a damaged one
raises :class:`~quantem_flow.errors.CorruptChunkError` naming the file, the
block and the frame.  The geometry (sector size, block size) is read from the
headers, not assumed.

The ``.gtg`` (Gatan's metadata, a DigitalMicrograph tag file) is recorded when
present, not interpreted: ``scan_shape=`` or a JSON sidecar gives the scan.
Dark and gain references are applied only when asked (``corrections=``, with
``dark_map=``/``gain_map=``: ``.npy`` or ``.mat`` of the frame's shape), the
values then ``float32`` ``(raw - dark) * gain``, each reference's path and
SHA-256 recorded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import CorruptChunkError, FormatError, ParameterError, SourceNotFoundError
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile
from .references import load_reference

__all__ = ["K2_SECTORS", "K2_SYNC", "K2isSource", "sniff"]

#: The sync word that starts every block.
K2_SYNC = 0xFFFF0055
#: Sector files of one acquisition.
K2_SECTORS = 8
_HEADER_BYTES = 40
_HEADER = np.dtype(
    {
        "names": ["sync", "block_count", "width", "height", "frame_id", "x0", "y0", "x1", "y1"],
        "formats": [">u4", ">u4", ">u2", ">u2", ">u4", ">u2", ">u2", ">u2", ">u2"],
        "offsets": [0, 16, 20, 22, 24, 28, 30, 32, 34],
        "itemsize": _HEADER_BYTES,
    }
)
_CORRECTIONS = ("dark", "gain")


def sniff(path: Path, head: bytes) -> bool:
    """A sector file starting with the block sync word 0xFFFF0055, or a .gtg beside them."""
    if head[:4] == K2_SYNC.to_bytes(4, "big"):
        return True
    return path.suffix.lower() == ".gtg" and head[:4] in (b"\x00\x00\x00\x03", b"\x00\x00\x00\x04")


def _sector_files(given: Path) -> tuple[Path | None, list[Path]]:
    """The ``.gtg`` (if any) and the eight sector files of the acquisition ``given`` names."""
    if given.suffix.lower() == ".gtg":
        stem, gtg = given.stem, given
    elif given.suffix.lower() == ".bin":
        stem, gtg = re.sub(r"_?\d+$", "", given.stem), None
    else:
        raise FormatError(
            f"{str(given)!r}: a K2 IS acquisition is opened by its .gtg or one of its .bin files"
        )
    files = [
        p
        for p in given.parent.glob(f"{stem}*.bin")
        if re.fullmatch(rf"{re.escape(stem)}_?\d+", p.stem)
    ]
    files.sort(key=lambda p: int(re.findall(r"\d+$", p.stem)[0]))
    if gtg is None:
        found = given.parent / f"{stem}.gtg"
        gtg = found if found.is_file() else None
    return gtg, files


class K2isSource(FrameSource):
    """A Gatan K2 IS raw acquisition (see the module docstring).

    Parameters
    ----------
    path
        The ``.gtg`` or any of the eight ``.bin`` sector files.
    scan_shape
        ``(rows, cols)``, ``"square"`` or ``None`` for a JSON sidecar.
    frame_offset
        Leading (synchronised) frames to skip.
    corrections
        Among ``"dark"`` and ``"gain"``, with ``dark_map=``/``gain_map=``.
    dark_map, gain_map
        ``.npy`` or ``.mat`` references of the frame's shape.
    """

    format: ClassVar[str] = "k2is"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
        corrections: Sequence[str] = (),
        dark_map: str | os.PathLike[str] | None = None,
        gain_map: str | os.PathLike[str] | None = None,
    ) -> None:
        self._handle_files: dict[int, PositionalFile] | None = None
        given = check_exists(path)
        self._gtg, self._files = _sector_files(given)
        if len(self._files) != K2_SECTORS:
            raise SourceNotFoundError(
                f"a K2 IS acquisition has {K2_SECTORS} sector files; beside {str(given)!r} "
                f"found {len(self._files)}: {[p.name for p in self._files]}"
            )
        self._path = self._gtg or self._files[0]
        self._open_notes: list[str] = []
        self._geometry, self._first_blocks, n = self._synchronise()
        sw, sh = self._geometry[:2]
        frame_shape = (sh, K2_SECTORS * sw)
        asked = tuple(corrections)
        unknown = sorted(set(asked) - set(_CORRECTIONS))
        if unknown:
            raise ParameterError(
                f"corrections={asked!r}: unknown {unknown}; K2 IS corrections are {_CORRECTIONS}"
            )
        self._corrections: dict[str, np.ndarray] = {}
        self._records: list[dict[str, str]] = []
        for kind, given_map in (("dark", dark_map), ("gain", gain_map)):
            if kind in asked:
                image, record = load_reference(given_map, frame_shape, kind=kind)
                self._corrections[kind] = image
                self._records.append(record)
            elif given_map is not None:
                raise ParameterError(
                    f"{kind}_map= was given without corrections=({kind!r},); pass both to apply it"
                )
        if self._gtg is None:
            self._open_notes.append("no .gtg beside the sector files (Gatan's metadata)")
        self._set_frames(
            n_frames=n,
            frame_shape=frame_shape,
            dtype=np.dtype(np.float32) if self._corrections else np.dtype(np.uint16),
            scan_shape=scan_shape,
            path=self._path,
            frame_offset=frame_offset,
        )

    # -- opening ------------------------------------------------------------------------
    def _headers(self, s: int, block_bytes: int) -> np.ndarray:
        path = self._files[s]
        n = path_size(path) // block_bytes
        layout = np.dtype({"names": ["h"], "formats": [_HEADER], "itemsize": block_bytes})
        return np.asarray(np.memmap(path, dtype=layout, mode="r", shape=(n,))["h"]).copy()

    def _synchronise(self) -> tuple[tuple[int, int, int, int, int], list[int], int]:
        """The geometry, each sector's first block of the first common frame, the frame count."""
        with open(self._files[0], "rb") as f:
            first = np.frombuffer(f.read(_HEADER_BYTES), dtype=_HEADER, count=1)
        if first.size == 0 or int(first["sync"][0]) != K2_SYNC:
            raise FormatError(
                f"{str(self._files[0])!r} does not start with a K2 IS block (sync "
                f"{K2_SYNC:#x}); it is not a K2 IS sector file"
            )
        sw, sh = int(first["width"][0]), int(first["height"][0])
        bw = int(first["x1"][0]) - int(first["x0"][0]) + 1
        bh = int(first["y1"][0]) - int(first["y0"][0]) + 1
        if min(sw, sh, bw, bh) < 1 or sw % bw or sh % bh or (bw * bh) % 2:
            raise FormatError(
                f"{str(self._files[0])!r}: sectors of {sh} x {sw} in blocks of {bh} x {bw} pixels "
                "do not tile (the first block's header is damaged)"
            )
        block_bytes = _HEADER_BYTES + 3 * bw * bh // 2
        per_frame = (sw // bw) * (sh // bh)
        runs: list[dict[int, int]] = []
        for s in range(K2_SECTORS):
            h = self._headers(s, block_bytes)
            good = (h["sync"] == K2_SYNC) & (h["width"] == sw) & (h["height"] == sh)
            fid = h["frame_id"].astype(np.int64)
            complete: dict[int, int] = {}
            if h.size:
                edges = np.flatnonzero(np.diff(fid) != 0) + 1
                starts = np.concatenate([[0], edges])
                stops = np.concatenate([edges, [h.size]])
                for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
                    if b - a == per_frame and bool(good[a:b].all()):
                        complete.setdefault(int(fid[a]), a)
            runs.append(complete)
        common = sorted(set.intersection(*(set(r) for r in runs)))
        if not common:
            raise CorruptChunkError(
                f"the eight sector files of {str(self._path)!r} hold no frame complete in every "
                "sector (blocks with the sync word, the sector size and one frame id each); the "
                "files are damaged or not of one acquisition"
            )
        first_id = common[0]
        ids = np.asarray(common, dtype=np.int64)
        gap = np.flatnonzero(ids != first_id + np.arange(ids.size))
        if gap.size:
            missing = int(first_id + gap[0])
            raise CorruptChunkError(
                f"frame id {missing} of {str(self._path)!r} is not complete in every sector "
                f"while frames {first_id}..{missing - 1} and later ones are: a dropped frame "
                f"would shift the scan. Open the frames before it with scan_shape= covering at "
                f"most {missing - first_id} frames"
            )
        n = ids.size
        firsts = [runs[s][first_id] for s in range(K2_SECTORS)]
        for s in range(K2_SECTORS):  # frames follow one another in every sector
            expected = firsts[s] + per_frame * np.arange(n)
            got = np.asarray([runs[s][int(i)] for i in ids])
            if not np.array_equal(got, expected):
                raise CorruptChunkError(
                    f"in {str(self._files[s])!r} the frames do not follow one another block after "
                    "block; the sector file is damaged"
                )
        skipped = max(firsts) // per_frame
        if any(firsts):
            self._open_notes.append(
                f"sectors synchronised at frame id {first_id}: the blocks before it (partial "
                f"frames, up to {skipped} frame(s) of blocks) are left out"
            )
        self._block_layout = self._layout(block_bytes, per_frame, firsts, n)
        return (sw, sh, bw, bh, block_bytes), firsts, n

    def _layout(
        self, block_bytes: int, per_frame: int, firsts: list[int], n: int
    ) -> list[np.ndarray]:
        """Per sector: the (x0, y0) of each block of a frame, the same in every frame (checked)."""
        out = []
        for s in range(K2_SECTORS):
            h = self._headers(s, block_bytes)[firsts[s] : firsts[s] + n * per_frame]
            xy = np.stack([h["x0"], h["y0"], h["x1"], h["y1"]], axis=1).astype(np.int64)
            frames = xy.reshape(n, per_frame, 4)
            bad = np.flatnonzero(~np.all(frames == frames[:1], axis=(1, 2)))
            if bad.size:
                raise CorruptChunkError(
                    f"frame {int(bad[0])} of {str(self._files[s])!r} places its blocks "
                    "differently from the first frame (a damaged block header)"
                )
            out.append(frames[0])
        return out

    # -- reading ------------------------------------------------------------------------
    def _file(self, s: int) -> PositionalFile:
        if self._handle_files is None:
            self._handle_files = {}
        found = self._handle_files.get(s)
        if found is None:
            found = PositionalFile(self._files[s])
            self._handle_files[s] = found
        return found

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Frames ``[start, stop)`` (absolute, after synchronisation), corrected when asked."""
        target = self._frames_target(start, stop, out)
        sw, _, bw, bh, block_bytes = self._geometry
        per_frame = len(self._block_layout[0])
        n = stop - start
        for s in range(K2_SECTORS):
            span = np.empty(n * per_frame * block_bytes, dtype=np.uint8)
            first = self._first_blocks[s] + start * per_frame
            if n:
                self._file(s).readinto(
                    first * block_bytes, span, what=f"frames [{start}, {stop}) of sector {s + 1}"
                )
            blocks = span.reshape(n, per_frame, block_bytes)
            sync = blocks[:, :, :4].copy().view(">u4")[..., 0]
            if n and not bool(np.all(sync == K2_SYNC)):
                f, b = (int(v[0]) for v in np.nonzero(sync != K2_SYNC))
                raise CorruptChunkError(
                    f"block {first + f * per_frame + b} of {str(self._files[s])!r} (frame "
                    f"{start + f}) has lost its sync word; the sector file is damaged"
                )
            pixels = _unpack12(blocks[:, :, _HEADER_BYTES:]).reshape(n, per_frame, bh, bw)
            x_base = s * sw
            for b, (x0, y0, _, _) in enumerate(self._block_layout[s].tolist()):
                target[:, y0 : y0 + bh, x_base + x0 : x_base + x0 + bw] = pixels[:, b]
        if "dark" in self._corrections:
            target -= self._corrections["dark"]
        if "gain" in self._corrections:
            target *= self._corrections["gain"]
        return self._delivered(target, out)

    # -- description ----------------------------------------------------------------------
    @property
    def streams_blocks(self) -> bool:
        """Any frames read for the cost of their own blocks."""
        return True

    @property
    def path(self) -> Path:
        """The ``.gtg`` (or the first sector file when there is none)."""
        return self._path

    @property
    def notes(self) -> list[str]:
        """Choices made while opening: synchronisation, the references (not) applied."""
        return [*super().notes, *self._open_notes]

    @property
    def identity(self) -> SourceIdentity:
        """The sector files (the .gtg and references applied), sizes, a digest of the layout."""
        paths = [*(str(p) for p in self._files)]
        if self._gtg is not None:
            paths.insert(0, str(self._gtg))
        paths += [r["path"] for r in self._records]
        return SourceIdentity(
            format=self.format,
            paths=tuple(paths),
            file_sizes=tuple(path_size(p) for p in paths),
            header_sha256=header_digest(
                self._geometry, self._first_blocks, [r["sha256"] for r in self._records]
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Geometry, synchronisation, the sector files, the references applied."""
        sw, sh, bw, bh, block_bytes = self._geometry
        return {
            "sector_shape": [sh, sw],
            "block_shape": [bh, bw],
            "block_bytes": block_bytes,
            "sector_files": [str(p) for p in self._files],
            "gtg": None if self._gtg is None else str(self._gtg),
            "first_blocks": list(self._first_blocks),
            "corrections": list(self._records),
            **self.scan_metadata(),
        }

    def close(self) -> None:
        """Close the sector files."""
        for f in (self._handle_files or {}).values():
            f.close()
        self._handle_files = None


def _unpack12(packed: np.ndarray) -> np.ndarray:
    """12-bit little-endian pixel pairs (three bytes each) to ``uint16``, in order."""
    triples = np.ascontiguousarray(packed).reshape(-1, 3).astype(np.uint16)
    out = np.empty((triples.shape[0], 2), dtype=np.uint16)
    out[:, 0] = triples[:, 0] | ((triples[:, 1] & 0x0F) << 8)
    out[:, 1] = (triples[:, 1] >> 4) | (triples[:, 2] << 4)
    return out.reshape(-1)
