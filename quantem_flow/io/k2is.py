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
synchronised here by frame id: each sector's first whole frame is found in its
first few frames of blocks, the latest of them is the first frame used, and
the partial frames before it (and after the last frame whole in every sector)
are left out and noted.  Opening reads a few headers, not the files (which can
be hundreds of GB): once the scan is known, per sector the first and last
block of the scan's last frame must name the frame id the first frame leads
to; when they do not (a block or frame lost or added), the first such frame is
found by bisection and refused, naming it (the scan would shift).  Damage
after the scan does not stop the scan opening.  The first frame's block
positions must tile each sector once.  Every block read is checked (sync
word, sector size, frame id, its place in its frame) and a damaged one raises
:class:`~quantem_flow.errors.CorruptChunkError` naming the file, the block and
the frame.  The geometry (sector size, block size) is read from the headers,
not assumed.

The ``.gtg`` (Gatan's metadata: a DigitalMicrograph 3 or 4 tag file) gives the
scan shape when it records one: ``SI Dimensions``, ``Size Y`` rows of ``Size
X`` columns (recorded); ``scan_shape=`` or a JSON sidecar otherwise.  No
calibration is read from it (none is known to be recorded there): give one
with a sidecar.

Bit 0 of a block header's flags byte (byte 9) is set while the shutter is
open, and cleared again when it closes (the camera runs on).  By default
(``frame_offset="shutter"``) the scan starts at the first frame flagged so
(every 16th frame read, then bisected; the frames before it, recorded while
the camera ran before the acquisition, are left out and noted), and one frame
earlier for a scan the ``.gtg`` describes: on recorded K2 IS scans the flag
is set one frame late (as LiberTEM's authors found on real data).  The
scan's last frame must still be flagged (a longer scan is refused).  An
integer ``frame_offset`` counts whole synchronised frames instead, the flags
unused.  Frames after the scan's ``rows x cols`` (given, from the ``.gtg`` or
a sidecar) are left out, noted with their count; too few frames raise.

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

import numba
import numpy as np

from ..errors import (
    CorruptChunkError,
    FormatError,
    ParameterError,
    ScanShapeError,
    SourceNotFoundError,
)
from .base import (
    FrameSource,
    SourceIdentity,
    check_exists,
    header_digest,
    path_size,
    read_sidecar,
)
from .fileio import PositionalFile, PositionalFiles
from .references import apply_dark_gain, asked_corrections, load_reference
from .sniffers import K2_SYNC
from .sniffers import k2is as sniff

__all__ = ["K2_SECTORS", "K2_SYNC", "SHUTTER_ACTIVE", "K2isSource", "gtg_scan_shape", "sniff"]

#: Sector files of one acquisition.
K2_SECTORS = 8
_HEADER_BYTES = 40
_HEADER = np.dtype(
    {
        "names": [
            "sync",
            "flags",
            "block_count",
            "width",
            "height",
            "frame_id",
            "x0",
            "y0",
            "x1",
            "y1",
        ],
        "formats": [">u4", "u1", ">u4", ">u2", ">u2", ">u4", ">u2", ">u2", ">u2", ">u2"],
        "offsets": [0, 9, 16, 20, 22, 24, 28, 30, 32, 34],
        "itemsize": _HEADER_BYTES,
    }
)
_CORRECTIONS = ("dark", "gain")
#: Bit of a block header's flags byte set while the shutter is open (the acquisition runs).
SHUTTER_ACTIVE = 0x1
#: Every this many frames, sector 1's flags are read to find the shutter opening.
_SHUTTER_STEP = 16
#: Frames of blocks read at the start of each sector to find where its first whole frame starts.
_SYNC_WINDOW_FRAMES = 4


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
        ``(rows, cols)``, ``"square"``, or ``None``: the ``.gtg``'s
        ``SI Dimensions`` (``Size Y`` rows of ``Size X`` columns), else a
        JSON sidecar.
    frame_offset
        ``"shutter"`` (default): the scan starts at the first frame whose
        blocks are flagged shutter-active, one frame earlier for a scan the
        ``.gtg`` describes (see the module docstring); or the number of whole,
        synchronised frames to skip (the flag then ignored, noted).
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
        frame_offset: int | str = "shutter",
        corrections: Sequence[str] = (),
        dark_map: str | os.PathLike[str] | None = None,
        gain_map: str | os.PathLike[str] | None = None,
    ) -> None:
        self._handle_files: PositionalFiles | None = None
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
        asked = asked_corrections(corrections, _CORRECTIONS, fmt="K2 IS")
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
        self._si_shape: tuple[int, int] | None = None
        if self._gtg is None:
            self._open_notes.append("no .gtg beside the sector files (Gatan's metadata)")
        else:
            try:
                self._si_shape = gtg_scan_shape(self._gtg)
            except FormatError as exc:
                if scan_shape is None:
                    raise FormatError(
                        f"{exc}; it records the scan shape: pass scan_shape=(rows, cols) to "
                        "open the sector files without it"
                    ) from exc
                self._open_notes.append(f"the .gtg could not be read ({exc}); scan_shape= used")
        how = None
        scan: Sequence[int] | str | None = scan_shape
        if scan_shape is None and self._si_shape is not None:
            scan = self._si_shape
            how = (
                f"the .gtg's SI Dimensions: Size Y {self._si_shape[0]} rows x Size X "
                f"{self._si_shape[1]} cols"
            )
        self._shutter_frame = self._first_shutter_frame(n)
        offset = self._frame_offset(frame_offset)
        wanted = _scan_frames(scan) if scan is not None else _sidecar_scan_frames(self._path)
        last = n if wanted is None else min(n, offset + wanted)
        if last > 0:
            self._check_in_place(last, offset)
        if wanted is not None and n - offset > wanted:  # the camera runs on after the scan
            self._open_notes.append(
                f"{n - offset - wanted} frame(s) after the scan's {wanted} (from frame "
                f"{offset + wanted} on) are left out"
            )
            n = offset + wanted
        if frame_offset == "shutter" and self._shutter_frame is not None and wanted is not None:
            self._check_shutter_open(offset + wanted - 1)
        self._set_frames(
            n_frames=n,
            frame_shape=frame_shape,
            dtype=np.dtype(np.float32) if self._corrections else np.dtype(np.uint16),
            scan_shape=scan,
            path=self._path,
            frame_offset=offset,
            scan_shape_from=how,
        )

    # -- opening ------------------------------------------------------------------------
    def _headers(self, s: int, block_bytes: int, first: int, count: int) -> np.ndarray:
        """The headers of blocks ``[first, first + count)`` of sector ``s`` (fewer at its end)."""
        f = self._file(s)
        count = max(0, min(count, f.size() // block_bytes - first))
        if not count:
            return np.empty(0, dtype=_HEADER)
        what = f"block headers [{first}, {first + count}) of sector {s + 1}"
        if count == 1:
            raw = f.readinto(first * block_bytes, np.empty(_HEADER_BYTES, np.uint8), what=what)
            return raw.view(_HEADER).copy()
        raw = f.readinto(first * block_bytes, np.empty(count * block_bytes, np.uint8), what=what)
        layout = np.dtype({"names": ["h"], "formats": [_HEADER], "itemsize": block_bytes})
        return raw.view(layout)["h"].copy()

    def _synchronise(self) -> tuple[tuple[int, int, int, int, int], list[int], int]:
        """The geometry, each sector's first block of the first common frame, the frame count.

        Reads a few frames of headers at the start of each sector, then, per
        sector, the first and last block of the last frame; only when those
        disagree with the frames before (a lost, added or dropped block or
        frame) is the first disagreeing frame found, by bisection.  Opening
        reads O(log frames) headers; every block's header is checked again
        when its frame is read.
        """
        first = self._headers(0, _HEADER_BYTES, 0, 1)
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
        self._geometry = (sw, sh, bw, bh, block_bytes)
        self._per_frame = per_frame
        found = []  # per sector: the first frame id complete in its first frames, where it starts
        for s in range(K2_SECTORS):
            ids, at = _complete_frames(
                self._headers(s, block_bytes, 0, _SYNC_WINDOW_FRAMES * per_frame), sw, sh, per_frame
            )
            if not ids.size:
                raise CorruptChunkError(
                    f"{str(self._files[s])!r} holds no frame complete in its first "
                    f"{_SYNC_WINDOW_FRAMES * per_frame} blocks (blocks with the sync word, the "
                    "sector size and one frame id each); the sector file is damaged or not of "
                    "this acquisition"
                )
            found.append((int(ids[0]), int(at[0])))
        first_id = max(i for i, _ in found)
        self._first_id = first_id
        firsts = [at + (first_id - i) * per_frame for i, at in found]
        counts = []
        for s in range(K2_SECTORS):
            if not self._frame_in_place(s, firsts[s], 0):
                raise CorruptChunkError(
                    f"frame id {first_id} is not complete in {str(self._files[s])!r} where the "
                    "sector's first frames place it; the sectors cannot be synchronised"
                )
            counts.append((path_size(self._files[s]) // block_bytes - firsts[s]) // per_frame)
        n = min(counts)
        if any(firsts):
            self._open_notes.append(
                f"sectors synchronised at frame id {first_id}: the blocks before it are left "
                f"out (partial frames; per sector file {dict(enumerate(firsts, start=1))})"
            )
        self._block_layout = [
            self._frame_layout(s, self._headers(s, block_bytes, firsts[s], per_frame))
            for s in range(K2_SECTORS)
        ]
        left = [
            (path_size(self._files[s]) // block_bytes - firsts[s]) - n * per_frame
            for s in range(K2_SECTORS)
        ]
        if any(left):
            self._open_notes.append(
                f"{max(left)} block(s) after frame id {first_id + n - 1} left out (a partial "
                "frame, or frames not complete in every sector: "
                f"{dict((s + 1, b) for s, b in enumerate(left) if b)} blocks per sector file)"
            )
        return self._geometry, firsts, n

    def _check_in_place(self, last: int, offset: int) -> None:
        """Frames ``[0, last)`` follow one another block after block in every sector.

        Frame 0 was checked when synchronising; frame ``last - 1`` is checked
        in each sector, and where it is out of place the first frame out of
        place is found by bisection and refused (a lost or added block or
        frame would shift the scan).  Damage after ``last`` (after the scan)
        does not matter.
        """
        for s in range(K2_SECTORS):
            if self._frame_in_place(s, self._first_blocks[s], last - 1):
                continue
            first = self._first_blocks[s]
            lo, hi = 0, last - 1  # frame lo in place, frame hi not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._frame_in_place(s, first, mid) else (lo, mid)
            missing = self._first_id + hi
            raise CorruptChunkError(
                f"frame id {missing} is not where frames {self._first_id}..{missing - 1} place "
                f"it in {str(self._files[s])!r} (a block or frame lost or added): a dropped "
                f"frame would shift the scan. Open the frames before it: scan_shape= covering "
                f"at most {max(hi - offset, 0)} frames from frame_offset={offset}"
            )

    def _flagged(self, s: int, k: int) -> bool:
        """Whether the first block of frame ``k`` of sector ``s`` flags the shutter open."""
        at = self._first_blocks[s] + k * self._per_frame
        h = self._headers(s, self._geometry[4], at, 1)
        return bool(h.size) and bool(int(h["flags"][0]) & SHUTTER_ACTIVE)

    def _first_shutter_frame(self, n: int) -> int | None:
        """The first frame flagged shutter-active (the latest over the sectors), or ``None``.

        The flag is set while the shutter is open and cleared after it closes
        (the camera runs on), so it is not monotone over the file: every
        ``_SHUTTER_STEP``-th frame of sector 1 (every frame of a short file) is
        read until one is flagged,
        then the frames since the previous sample are bisected, in each sector.
        An acquisition shorter than ``_SHUTTER_STEP`` frames may be missed (noted
        as no flag found).
        """
        step = self._shutter_step = max(1, min(_SHUTTER_STEP, n // 16))
        hit = next((k for k in range(0, n, step) if self._flagged(0, k)), None)
        if hit is None:
            return None
        lo = hit - step if hit else -1  # not flagged (or before the first frame)
        found = []
        for s in range(K2_SECTORS):
            if not self._flagged(s, hit):
                self._open_notes.append(
                    f"{str(self._files[s])!r} does not flag frame {hit} shutter-active while "
                    "sector 1 does; that sector's flags are not used"
                )
                continue
            a, b = lo, hit
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (a, mid) if self._flagged(s, mid) else (mid, b)
            found.append(b)
        if len(set(found)) > 1:
            self._open_notes.append(
                f"the sectors flag the shutter open from different frames {found}; the latest, "
                f"{max(found)}, is taken"
            )
        return max(found)

    def _check_shutter_open(self, last: int) -> None:
        """The scan's last frame is still flagged shutter-active (else the scan is too long)."""
        if not self._flagged(0, last):
            raise ScanShapeError(
                f"the scan would end at frame {last} of {str(self._path)!r}, after the shutter "
                f"closed (its blocks are not flagged shutter-active; the scan starts at frame "
                f"{self._shutter_frame}): check scan_shape=, or pass an integer frame_offset= to "
                "open these frames anyway"
            )

    def _frame_offset(self, asked: int | str) -> int:
        """The frames skipped before the scan (see ``frame_offset``), with its note."""
        if not isinstance(asked, str):
            if isinstance(asked, bool) or int(asked) < 0:
                raise ParameterError(
                    f"frame_offset={asked!r}; pass 'shutter' (the default) or a number of "
                    "frames >= 0"
                )
            if self._shutter_frame not in (None, 0):
                self._open_notes.append(
                    f"frame_offset={asked} given: the first frame flagged shutter-active "
                    f"({self._shutter_frame}) is not used"
                )
            return int(asked)
        if asked != "shutter":
            raise ParameterError(
                f"frame_offset={asked!r}; pass 'shutter' (the default) or a number of frames"
            )
        if self._shutter_frame is None:
            self._open_notes.append(
                "no block is flagged shutter-active (the first block of every "
                f"{self._shutter_step} frame(s) read); the scan starts at the first whole frame"
            )
            return 0
        start = self._shutter_frame
        if self._si_shape is not None and start > 0:
            start -= 1
            self._open_notes.append(
                f"the scan starts at frame {start}, one before the first frame flagged "
                f"shutter-active ({self._shutter_frame}): on recorded K2 IS scans the flag "
                "comes one frame late (pass frame_offset= to choose another start)"
            )
        elif self._si_shape is not None:
            self._open_notes.append(
                "the first whole frame is already flagged shutter-active: the frame before it, "
                "where a K2 IS scan would start (the flag comes one frame late), is not in the "
                "files whole; the scan starts at frame 0. Check the first row, or pass "
                "frame_offset="
            )
        elif start:
            self._open_notes.append(
                f"the acquisition starts at frame {start}, the first flagged shutter-active; "
                f"the {start} frame(s) before it are left out"
            )
        return start

    def _frame_layout(self, s: int, h: np.ndarray) -> np.ndarray:
        """The (x0, y0) of each block of the first frame, checked to tile the sector once."""
        sw, sh, bw, bh, _ = self._geometry
        x0, y0 = h["x0"].astype(np.int64), h["y0"].astype(np.int64)
        sized = (h["x1"].astype(np.int64) - x0 + 1 == bw) & (
            h["y1"].astype(np.int64) - y0 + 1 == bh
        )
        inside = (x0 % bw == 0) & (y0 % bh == 0) & (x0 + bw <= sw) & (y0 + bh <= sh)
        cells = (y0 // bh) * (sw // bw) + x0 // bw
        if not bool((sized & inside).all()) or np.unique(cells).size != cells.size:
            raise CorruptChunkError(
                f"the blocks of the first frame in {str(self._files[s])!r} do not tile its "
                f"{sh} x {sw} sector once in {bh} x {bw} blocks (block positions "
                f"{np.stack([y0, x0], axis=1).tolist()[:8]}...); the sector file is damaged"
            )
        return np.stack([x0, y0], axis=1)

    def _frame_in_place(self, s: int, first: int, k: int) -> bool:
        """Whether the ``k``-th frame after ``first`` starts and ends where it should."""
        sw, sh, _, _, block_bytes = self._geometry
        start = first + k * self._per_frame
        for at in (start, start + self._per_frame - 1):
            h = self._headers(s, block_bytes, at, 1)
            if not (
                h.size
                and int(h["sync"][0]) == K2_SYNC
                and (int(h["width"][0]), int(h["height"][0])) == (sw, sh)
                and int(h["frame_id"][0]) == self._first_id + k
            ):
                return False
        return True

    # -- reading ------------------------------------------------------------------------
    def _file(self, s: int) -> PositionalFile:
        if self._handle_files is None:
            self._handle_files = PositionalFiles()
        return self._handle_files.get(self._files[s])

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
            if n:
                self._check_blocks(s, blocks, start, first)
            _place_blocks(blocks, self._block_layout[s], s * sw, bh, bw, target)
        apply_dark_gain(target, self._corrections)
        return self._delivered(target, out)

    def _check_blocks(self, s: int, blocks: np.ndarray, start: int, first: int) -> None:
        """Every block read: its sync word, sector size, frame id and place in its frame."""
        sw, sh = self._geometry[:2]
        h = np.ascontiguousarray(blocks[:, :, :_HEADER_BYTES]).view(_HEADER)[
            ..., 0
        ]  # flags unchecked
        n = h.shape[0]
        layout = self._block_layout[s]
        faults = [
            (h["sync"] != K2_SYNC, "has lost its sync word"),
            ((h["width"] != sw) | (h["height"] != sh), f"does not name the {sh} x {sw} sector"),
            (
                h["frame_id"] != (self._first_id + start + np.arange(n))[:, None],
                "names another frame id (a block lost or added)",
            ),
            (
                (h["x0"] != layout[:, 0]) | (h["y0"] != layout[:, 1]),
                "lies elsewhere in its frame than in the first frame",
            ),
        ]
        for bad, why in faults:
            if bool(bad.any()):
                f, b = (int(v[0]) for v in np.nonzero(bad))
                raise CorruptChunkError(
                    f"block {first + f * self._per_frame + b} of {str(self._files[s])!r} (frame "
                    f"{start + f}) {why}; the sector file is damaged"
                )

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
                self._geometry,
                self._first_blocks,
                self._shutter_frame,
                [r["sha256"] for r in self._records],
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
            "si_dimensions": None if self._si_shape is None else list(self._si_shape),
            "shutter_first_frame": self._shutter_frame,
            "corrections": list(self._records),
            **self.scan_metadata(),
        }

    def close(self) -> None:
        """Close the sector files."""
        if self._handle_files is not None:
            self._handle_files.close()


def _scan_frames(scan: Sequence[int] | str) -> int | None:
    """Frames a ``(rows, cols)`` scan holds; ``None`` for a rule (``"square"``)."""
    if isinstance(scan, str) or len(scan) != 2:
        return None
    rows, cols = scan
    return int(rows) * int(cols) if int(rows) > 0 and int(cols) > 0 else None


def _sidecar_scan_frames(path: Path) -> int | None:
    """Frames of the scan a JSON sidecar gives (``None``: none, or malformed: checked later)."""
    found = read_sidecar(path)
    shape = None if found is None else found[1].get("scan_shape")
    if (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
    ):
        return int(shape[0]) * int(shape[1])
    return None


def gtg_scan_shape(gtg: Path) -> tuple[int, int] | None:
    """The scan ``(rows, cols)`` a ``.gtg`` records (``SI Dimensions``: ``Size Y``, ``Size X``).

    ``None`` when the tags are absent (a time series, or not a scan).

    Raises
    ------
    FormatError
        The ``.gtg`` is not a DigitalMicrograph tag file, or the sizes are not
        positive integers.
    """
    from .dm4 import parse_dm_tags

    tags, _, _ = parse_dm_tags(gtg)
    si = tags.get("SI Dimensions")
    if not isinstance(si, dict) or "Size X" not in si or "Size Y" not in si:
        return None
    rows, cols = si["Size Y"], si["Size X"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (rows, cols)):
        raise FormatError(
            f"{str(gtg)!r}: SI Dimensions Size Y {rows!r}, Size X {cols!r}; expected positive "
            "integers"
        )
    return int(rows), int(cols)


def _complete_frames(
    h: np.ndarray, sw: int, sh: int, per_frame: int
) -> tuple[np.ndarray, np.ndarray]:
    """Frame ids whose blocks lie whole, one after the other, in a sector; and where each starts.

    A run is a stretch of blocks of one frame id; it is complete when it holds
    ``per_frame`` blocks, each with the sync word and the sector's size.  An id
    with several complete runs (a damaged file) keeps its first.
    """
    if not h.size:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    good = (h["sync"] == K2_SYNC) & (h["width"] == sw) & (h["height"] == sh)
    fid = h["frame_id"].astype(np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(fid) != 0) + 1])
    lengths = np.diff(np.append(starts, h.size))
    whole = (lengths == per_frame) & np.logical_and.reduceat(good, starts)
    ids, first = np.unique(fid[starts[whole]], return_index=True)
    return ids, starts[whole][first]


@numba.njit(cache=True, nogil=True)
def _place_blocks(blocks, layout, x_base, bh, bw, target):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Unpack each block's 12-bit pixels (two in three bytes) into its place in ``target``.

    ``blocks`` is ``(frames, blocks per frame, block bytes)`` of one sector,
    ``layout`` the ``(x0, y0)`` of each block within the sector, ``x_base`` the
    sector's first column in the frame; pixels run row-major within a block:
    ``a = b0 | (b1 & 15) << 8``, ``b = b1 >> 4 | b2 << 4``.  Offsets are
    computed flat: a view per block and row cost more than its 16 pixels
    (measured: 1.39 against 0.82 GiB/s on the camera's geometry; writing frame
    rows across the blocks beside one another was slower again, 0.96).
    """
    n, per_frame, block_bytes = blocks.shape
    _, rows, cols = target.shape
    src = blocks.reshape(-1)
    dst = target.reshape(-1)
    for f in range(n):
        for b in range(per_frame):
            x0 = x_base + layout[b, 0]
            y0 = layout[b, 1]
            p = (f * per_frame + b) * block_bytes + 40
            if bw % 2 == 0:  # pairs never straddle a row
                for y in range(bh):
                    q = (f * rows + y0 + y) * cols + x0
                    for _ in range(bw // 2):
                        b0 = np.uint16(src[p])
                        b1 = np.uint16(src[p + 1])
                        b2 = np.uint16(src[p + 2])
                        dst[q] = b0 | ((b1 & 15) << 8)
                        dst[q + 1] = (b1 >> 4) | (b2 << 4)
                        p += 3
                        q += 2
            else:
                for i in range(bh * bw):
                    at = p + (i // 2) * 3
                    if i % 2 == 0:
                        v = np.uint16(src[at]) | ((np.uint16(src[at + 1]) & 15) << 8)
                    else:
                        v = (np.uint16(src[at + 1]) >> 4) | (np.uint16(src[at + 2]) << 4)
                    dst[(f * rows + y0 + i // bw) * cols + x0 + i % bw] = v
