"""A live series kept as the compressed chunks it came in, read by the pass's workers.

A DECTRIS detector sends each image as a bitshuffle+LZ4 chunk of about
1-2 KB (sparse frames) for 74 KB of pixels (192 x 192 uint16).  Decoding in
the receiver and writing the pixels cost ~90 us a frame here (half the
decoder, half the page cache taking 74 KB), which is the whole of one core
at 10 kHz.  So the receiver keeps the chunks as they are, checked (the
same check as for files, before anything trusts their block lengths), and
the workers of the pass decode them, in parallel and without the GIL, into
the buffers they compute on:

* ``live_chunks.bin``: the chunks back to back, in arrival order;
* ``live_chunks.idx``: per image number, ``(byte offset, length)`` as two
  little-endian int64 (length 0: the image never came; it reads as 0);
* ``live.json``: the manifest (storage, scan shape, frame shape, dtype,
  stream), which :func:`open_live_folder` reads to open a kept folder again.

Frames that did not come as bitshuffle+LZ4 (the stream's ``lz4``, none, or a
Merlin) are kept decoded in ``live_frames.raw`` instead (storage ``"raw"``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import CorruptChunkError, FormatError
from ..io.base import FrameSource, SourceIdentity, header_digest, path_size

__all__ = [
    "CHUNKS",
    "INDEX",
    "MANIFEST",
    "RAW",
    "ChunkStoreWriter",
    "LiveChunkSource",
    "open_live_folder",
    "write_manifest",
]

CHUNKS = "live_chunks.bin"
INDEX = "live_chunks.idx"
RAW = "live_frames.raw"
MANIFEST = "live.json"


def write_manifest(folder: Path, record: dict[str, Any]) -> None:
    """Write ``live.json`` (what the folder holds and how to read it)."""
    (folder / MANIFEST).write_text(json.dumps(record, indent=1), encoding="utf-8")


class ChunkStoreWriter:
    """Appends chunks and records where each lies (the receiving process's side).

    Chunks are gathered in memory and written with one ``pwrite`` per
    :meth:`flush` (the receiver flushes when scan rows complete, before it
    says so, and at least every ``FLUSH_BYTES``): two system calls a frame
    were a third of the receiver's time at 10 kHz.
    """

    FLUSH_BYTES = 4 << 20

    def __init__(self, folder: Path, n_images: int) -> None:
        self._data = os.open(folder / CHUNKS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._index_fd = os.open(folder / INDEX, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self._index_fd, 16 * int(n_images))
        self._index = np.zeros((int(n_images), 2), dtype="<i8")
        self._pending: list[bytes] = []
        self._pending_ids: list[int] = []
        self._pending_bytes = 0
        self._end = 0  # bytes of the chunk file written and queued

    def write(self, image_id: int, chunk: bytes) -> None:
        """Queue image ``image_id``'s chunk (written at the next flush)."""
        n = len(chunk)
        self._index[image_id] = (self._end, n)
        self._end += n
        self._pending.append(chunk)
        self._pending_ids.append(image_id)
        self._pending_bytes += n
        if self._pending_bytes >= self.FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the queued chunks, then their index entries (a reader never sees one early)."""
        if not self._pending:
            return
        blob = b"".join(self._pending)
        at = self._end - len(blob)
        written = os.pwrite(self._data, blob, at)
        if written != len(blob):  # a full disk: say so (what came before is kept)
            raise OSError(
                f"only {written} of {len(blob)} bytes of images {self._pending_ids[0]}..."
                f"{self._pending_ids[-1]} were written"
            )
        ids = np.asarray(self._pending_ids)
        lo, hi = int(ids.min()), int(ids.max()) + 1
        os.pwrite(self._index_fd, self._index[lo:hi].tobytes(), 16 * lo)
        self._pending.clear()
        self._pending_ids.clear()
        self._pending_bytes = 0

    def close(self) -> None:
        """Flush and close both files."""
        try:
            self.flush()
        finally:
            os.close(self._data)
            os.close(self._index_fd)


class LiveChunkSource(FrameSource):
    """The frames of a live series kept as bitshuffle+LZ4 chunks (see the module).

    Parameters
    ----------
    folder
        The folder holding ``live.json``, ``live_chunks.bin`` and ``live_chunks.idx``.
    """

    format: ClassVar[str] = "live-chunks"
    #: The chunks as received are the payload: passes decode them piece by piece.
    #: Dense by default: one frame per chunk makes the encoded pass's per-piece cost
    #: larger than decoding a block at once (measured: 1.88 s against 1.52 s for BF+ADF+CoM
    #: of 40,000 ARINA-like frames); ``to_representation("encoded")`` keeps them encoded.
    native_representation: ClassVar[str] = "dense"
    payload_representations: ClassVar[frozenset[str]] = frozenset({"encoded"})

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self._folder = Path(folder).expanduser().absolute()
        manifest = _manifest(self._folder)
        if manifest.get("storage") != "bslz4-chunks":
            raise FormatError(
                f"{str(self._folder / MANIFEST)!r} describes storage "
                f"{manifest.get('storage')!r}, not 'bslz4-chunks'"
            )
        R, C = (int(v) for v in manifest["scan_shape"])
        self._manifest = manifest
        self._set_frames(
            n_frames=R * C,
            frame_shape=tuple(int(v) for v in manifest["frame_shape"]),  # type: ignore[arg-type]
            dtype=np.dtype(manifest["dtype"]),
            scan_shape=(R, C),
            path=self._folder / CHUNKS,
            scan_shape_from="the live series' scan_shape",
        )
        self._handle_fds: tuple[int, int] | None = None

    @property
    def path(self) -> Path:
        """The chunk file."""
        return self._folder / CHUNKS

    @property
    def identity(self) -> SourceIdentity:
        """The three files, their sizes and a digest of the manifest."""
        paths = [self._folder / n for n in (MANIFEST, CHUNKS, INDEX)]
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(p) for p in paths),
            file_sizes=tuple(path_size(p) for p in paths),
            header_sha256=header_digest(json.dumps(self._manifest, sort_keys=True)),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """The manifest and the scan layout."""
        return {"live": dict(self._manifest), **self.scan_metadata()}

    def _fds(self) -> tuple[int, int]:
        if self._handle_fds is None:
            self._handle_fds = (
                os.open(self._folder / CHUNKS, os.O_RDONLY),
                os.open(self._folder / INDEX, os.O_RDONLY),
            )
        return self._handle_fds

    def close(self) -> None:
        """Close the files (reopened on the next read)."""
        if self._handle_fds is not None:
            for fd in self._handle_fds:
                os.close(fd)
            self._handle_fds = None

    def _index(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, lengths)`` of images ``[start, stop)``."""
        n = stop - start
        raw_index = os.pread(self._fds()[1], 16 * n, 16 * start)
        if len(raw_index) != 16 * n:
            raise CorruptChunkError(
                f"{str(self._folder / INDEX)!r} ends before image {start + len(raw_index) // 16}; "
                f"expected entries for images [{start}, {stop})"
            )
        index = np.frombuffer(raw_index, dtype="<i8").reshape(n, 2)
        return index[:, 0], index[:, 1]

    def _span(self, offsets: np.ndarray, lengths: np.ndarray, what: str) -> tuple[np.ndarray, int]:
        """The chunk file's bytes holding every present chunk, and the first byte's offset."""
        present = lengths > 0
        if not present.any():
            return np.zeros(0, dtype=np.uint8), 0
        lo = int(offsets[present].min())
        hi = int((offsets + lengths)[present].max())
        span = np.frombuffer(os.pread(self._fds()[0], hi - lo, lo), dtype=np.uint8)
        if span.size != hi - lo:
            raise CorruptChunkError(
                f"{str(self._folder / CHUNKS)!r} ends at byte {lo + span.size}; its index says "
                f"{what} reach byte {hi}"
            )
        return span, lo

    def read_payload(
        self, representation: str, rows: tuple[int, int], cols: tuple[int, int], **options: Any
    ) -> Any:
        """A scan block as the chunks the detector sent (``"encoded"``), not decoded.

        One piece per image (an image that never came is an empty piece,
        which decodes to 0); each chunk is checked when a pass decodes it.
        """
        if representation != "encoded":
            return super().read_payload(representation, rows, cols, **options)
        from ..io.encoded_chunks import check_native_options, flat_frame_ranges
        from ..representations.encoded import build_payload

        self.check_block(rows, cols)
        codec = "bitshuffle-lz4"
        config: dict[str, Any] = {
            "format": "HDF5 bitshuffle filter 32008 chunk (12-byte header)",
            "block_size": "auto (chunk header)",
        }
        check_native_options(options, codec, config)
        pieces: list[np.ndarray] = []
        origin: list[tuple[int, int]] = []
        for start, stop in flat_frame_ranges(rows, cols, self._scan.shape[1], 0):
            offsets, lengths = self._index(start, stop)
            span, lo = self._span(offsets, lengths, f"images [{start}, {stop})")
            for i in range(stop - start):
                a, n = int(offsets[i]) - lo, int(lengths[i])
                pieces.append(span[a : a + n] if n > 0 else span[:0])
                origin.append((0, start + i))
        return build_payload(
            scan_shape=(rows[1] - rows[0], cols[1] - cols[0]),
            frame_shape=self._frame_shape,
            value_dtype=self._dtype,
            codec=codec,
            codec_config={**config, "made": "live stream chunks as received"},
            pieces=pieces,
            piece_frames=[1] * len(pieces),
            runs=[(i, 0, 1) for i in range(len(pieces))],
            origins=(f"chunk file {str(self._folder / CHUNKS)!r} (origin row: 0, image number)",),
            piece_origin=origin,
            fill_value=0,
        )

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Decode frames ``[start, stop)``: each chunk checked, then decoded into ``out``."""
        from ..representations.encoded import decode_bitshuffle_chunk

        kr, kc = self._frame_shape
        n = stop - start
        if out is None:
            out = np.empty((n, kr, kc), dtype=self._dtype)
        offsets, lengths = self._index(start, stop)
        present = lengths > 0
        if not present.any():
            out[...] = 0
            return out
        span, lo = self._span(offsets, lengths, f"images [{start}, {stop})")
        n_elem = kr * kc
        flat = out.reshape(n, n_elem)
        for i in range(n):
            if not present[i]:
                flat[i] = 0
                continue
            a = int(offsets[i]) - lo
            chunk = span[a : a + int(lengths[i])]
            try:  # checked (sizes, block lengths), then decoded
                flat[i] = decode_bitshuffle_chunk(chunk, n_elem, self._dtype)
            except ValueError as exc:
                raise CorruptChunkError(
                    f"image {start + i} of the live series in {str(self._folder)!r} is damaged: "
                    f"{exc}"
                ) from exc
        return out


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        from ..errors import SourceNotFoundError

        raise SourceNotFoundError(
            f"{str(folder)!r} holds no {MANIFEST}: not the folder of a live series (qf.live("
            "..., directory=) or quantem-flow live --keep DIR)"
        ) from None
    except (OSError, ValueError) as exc:
        raise FormatError(f"{str(path)!r} cannot be read as JSON: {exc}") from exc
    if not isinstance(record, dict) or "storage" not in record:
        raise FormatError(f"{str(path)!r} is not a live series' manifest (no 'storage')")
    return record


def open_live_folder(
    folder: str | os.PathLike[str],
    *,
    calibration: Any = None,
    chunk_rows: int | None = None,
    scan_rows: Sequence[int] | None = None,
) -> Any:
    """Open the frames a live series kept in a folder (``qf.live(directory=...)``).

    Parameters
    ----------
    folder
        The folder (it holds ``live.json``).
    calibration, chunk_rows
        As for :func:`quantem_flow.open` (default: the calibration the series
        was received with).
    scan_rows
        ``(first, stop)`` scan rows to keep (the whole scan when ``None``).

    Returns
    -------
    Dataset4D
        The series in scan order; images that never came read as 0.
    """
    from .. import open as open_dataset

    where = Path(folder).expanduser().absolute()
    manifest = _manifest(where)
    cal = calibration if calibration is not None else manifest.get("calibration")
    if manifest["storage"] == "bslz4-chunks":
        ds = open_dataset(LiveChunkSource(where), calibration=cal, chunk_rows=chunk_rows)
    elif manifest["storage"] == "raw":
        ds = open_dataset(
            where / RAW,
            format="raw",
            dtype=manifest["dtype"],
            frame_shape=manifest["frame_shape"],
            scan_shape=manifest["scan_shape"],
            calibration=cal,
            chunk_rows=chunk_rows,
        )
    else:
        raise FormatError(
            f"{str(where / MANIFEST)!r} names storage {manifest['storage']!r}; this version "
            "reads 'bslz4-chunks' and 'raw'"
        )
    if scan_rows is not None:
        ds = ds.crop_scan(rows=(int(scan_rows[0]), int(scan_rows[1])))
    return ds
