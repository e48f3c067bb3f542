"""The source protocol every reader implements.

A :class:`Source` describes one 4D-STEM input ``I[R_r, R_c, k_r, k_c]`` and
reads rectangular blocks of scan positions from it.  Sources are small,
picklable descriptions: they hold paths and parameters, open their files
lazily inside the process that reads, and drop open handles when pickled,
so the same object can be shipped to every Dask worker.

Readers whose files store a flat sequence of frames (Dectris, Merlin,
EMPAD, raw, 3-D HDF5/NumPy/Zarr) derive from :class:`FrameSource` and only
implement :meth:`FrameSource.read_frames`.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import (
    DtypeError,
    FormatError,
    ParameterError,
    ScanShapeError,
    ShapeError,
    SourceNotFoundError,
    UnsupportedOperationError,
)
from ..representations.stored import StoredFrames, concat_stored

__all__ = [
    "FrameSource",
    "ResidentOnlySource",
    "ScanShapeChoice",
    "Source",
    "SourceIdentity",
    "calibration_choice",
    "check_exists",
    "described_calibration",
    "drop_unusable_samplings",
    "header_digest",
    "resolve_scan_shape",
]


@dataclasses.dataclass(frozen=True)
class SourceIdentity:
    """Who a source is: enough to tell whether two results share an input.

    Attributes
    ----------
    format
        Reader name (``"hdf5"``, ``"dectris"``, ``"mib"``...).
    paths
        Absolute paths of every file that holds data or metadata.
    file_sizes
        Size in bytes of each path (directories: total of the files below).
    header_sha256
        SHA-256 over the headers, shapes and dtypes the reader relied on.
    """

    format: str
    paths: tuple[str, ...]
    file_sizes: tuple[int, ...]
    header_sha256: str

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "format": self.format,
            "paths": list(self.paths),
            "file_sizes": list(self.file_sizes),
            "header_sha256": self.header_sha256,
        }


def header_digest(*parts: Any) -> str:
    """Return the SHA-256 of a sequence of header parts.

    Bytes are hashed as they are; anything else by its ``repr``.
    """
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, (bytes, bytearray)) else repr(part).encode())
        h.update(b"\x00")
    return h.hexdigest()


def path_size(path: str | os.PathLike[str]) -> int:
    """Return the size of a file, or of all files below a directory, in bytes."""
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except FileNotFoundError as exc:
        raise SourceNotFoundError(
            f"input file {str(p)!r} disappeared after the dataset was opened ({exc}); restore "
            "it, or open the dataset again"
        ) from exc


def check_exists(path: str | os.PathLike[str], *, what: str = "input file") -> Path:
    """Return ``path`` as an absolute :class:`Path` or raise a clear error.

    A path that exists but is neither a regular file nor a directory (a FIFO, a
    socket, a device) is refused at once: reading one blocks or never ends.
    """
    p = Path(path).expanduser()
    if not p.exists():
        parent = p.parent if str(p.parent) else Path(".")
        hint = ""
        if parent.is_dir():
            near = sorted(x.name for x in parent.iterdir() if x.name.startswith(p.name[:3]))[:5]
            if near:
                hint = f"; similar names in {parent}: {near}"
        raise SourceNotFoundError(f"{what} {str(p)!r} does not exist{hint}")
    check_regular(p, what=what)
    return p.resolve()


def check_regular(path: str | os.PathLike[str], *, what: str = "input file") -> None:
    """Refuse a path that is not a regular file or a directory (a FIFO, socket, device).

    Raises
    ------
    FormatError
        Naming what the path is and what to do.
    """
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a missing path is the caller's error to give
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a character device"
        if stat.S_ISCHR(mode)
        else "a block device"
        if stat.S_ISBLK(mode)
        else "not a regular file"
    )
    raise FormatError(
        f"{what} {os.fspath(path)!r} is {kind}; quantem-flow reads regular files and "
        "directories (readers seek and read chunks again). Write the data to a file first"
    )


def as_dtype(value: Any, *, what: str) -> np.dtype[Any]:
    """``np.dtype(value)``, or the project's :class:`DtypeError` naming ``what``."""
    try:
        dtype: np.dtype[Any] = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise DtypeError(
            f"{what} must be a NumPy dtype such as 'uint16', '<u2' or 'float32', got {value!r} "
            f"({exc})"
        ) from exc
    return dtype


class Source(abc.ABC):
    """A readable 4D-STEM input.

    Subclasses set :attr:`format` and implement :attr:`shape`, :attr:`dtype`,
    :attr:`identity` and :meth:`read`.
    """

    format: ClassVar[str] = "abstract"
    #: The representation the file stores (what ``open`` gives by default).
    native_representation: ClassVar[str] = "dense"
    #: Representations :meth:`read_payload` makes without a dense intermediate.
    payload_representations: ClassVar[frozenset[str]] = frozenset()
    #: The path exactly as passed to ``open`` (before ``~`` expansion and symlink
    #: resolution), set by :func:`quantem_flow.io.open_source`; ``None`` when
    #: unknown or in memory.  Provenance records it beside the resolved paths.
    opened_as: str | None = None

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, int, int, int]:
        """Logical shape ``(R_r, R_c, k_r, k_c)``."""

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype[Any]:
        """Native-byte-order dtype of the values :meth:`read` returns."""

    @property
    @abc.abstractmethod
    def identity(self) -> SourceIdentity:
        """Identity for provenance."""

    @property
    def metadata(self) -> dict[str, Any]:
        """Small JSON-ready metadata the reader found (detector, acquisition...)."""
        return {}

    @property
    def calibration(self) -> Calibration | None:
        """Calibration found in the file or its sidecar, if any."""
        return None

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening (recorded in provenance)."""
        return []

    @property
    def integrity(self) -> tuple[bool, str]:
        """Whether every stored chunk carries a checksum that is verified on read, and how.

        Returns ``(True, "how")`` when corruption of the stored bytes is
        detected (HDF5 Fletcher32, Zarr crc32c), else ``(False, "why not")``;
        see ``docs/data-integrity.md``.
        """
        return (
            False,
            f"the {self.format} reader's files store no checksum, so a corrupted byte reads as "
            "a different value",
        )

    @property
    def streams_blocks(self) -> bool:
        """Whether any scan block reads for the cost of its own bytes.

        ``True`` lets a chunk pass read its chunk in cache-sized pieces
        (docs/streamed-pass.md): formats storing frames as flat records
        (``.npy``, raw), in memory, or compressed one frame per stored
        chunk (bitshuffle HDF5).  ``False`` (the default) for formats whose
        stored units (chunks of several frames) would be decoded once per
        piece.
        """
        return False

    def block_bytes(self, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[Path, int] | None:
        """Where scan block ``rows x cols`` lies as one run of stored bytes, if it does.

        ``(file, byte offset)`` when the block's frames are contiguous in one
        file, uncompressed, in native byte order and in scan order, so that
        a streamed pass may view them in place through a map
        (:mod:`quantem_flow.io.mapped`); ``None`` (the default) otherwise.
        """
        return None

    @property
    def stored_frames_codec(self) -> str | None:
        """The codec of frames :meth:`stored_block` returns as stored, or ``None`` (the default).

        ``"bitshuffle-lz4"`` for files storing each frame as one bitshuffle +
        LZ4 chunk read directly (:class:`~quantem_flow.representations.stored.StoredFrames`).
        A dense pass over such a source hashes the stored chunks (its content
        digest names the bytes read from the file: docs/data-integrity.md),
        and the CPU runtime may compute masked sums on their bit planes
        without decoding them (docs/bitplane-kernel.md).
        """
        return None

    def stored_block(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> StoredFrames:
        """Scan block ``rows x cols`` as stored, in scan order (when :attr:`stored_frames_codec`).

        ``buffer`` (``uint8``) is used for the bytes when large enough.
        """
        raise UnsupportedOperationError(
            f"the {self.format} reader does not read frames as stored (stored_frames_codec "
            "is None); read them with read()"
        )

    @property
    def row_chunk_multiple(self) -> int | None:
        """Scan rows per stored chunk, when the input is chunked by whole scan rows.

        A dataset's default chunks are then a multiple of it, so no stored
        chunk is read by two tasks (a Dask array's row chunks).  ``None``
        (the default) leaves the chunk size to ``chunk_mib`` alone.
        """
        return None

    @property
    def nbytes(self) -> int:
        """Logical (decoded) size in bytes."""
        return int(math.prod(self.shape)) * int(self.dtype.itemsize)

    @abc.abstractmethod
    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Read the half-open scan block ``rows x cols``.

        Parameters
        ----------
        rows, cols
            Half-open ``(start, stop)`` scan row and column ranges.
        buffer
            A C-contiguous array of the block's shape and :attr:`dtype` the
            reader may decode into instead of allocating (a staging buffer
            reused across chunks).  The returned array is authoritative: it
            may be ``buffer``, a read-only view of a memory map, or new.

        Returns
        -------
        numpy.ndarray
            Array of shape ``(rows, cols, k_r, k_c)`` and dtype :attr:`dtype`.

        Raises
        ------
        CorruptChunkError
            If stored bytes cannot be read or decoded; the message names the
            file, the dataset and the frames.
        """

    def read_payload(
        self, representation: str, rows: tuple[int, int], cols: tuple[int, int], **options: Any
    ) -> Any:
        """Read a scan block directly in a non-dense representation.

        Only for names in :attr:`payload_representations` (for example the
        compressed chunks of a Dectris file as ``encoded``, or the events of
        a counted file as ``paired``).  The payload covers the source's full
        detector; detector transforms are applied by the caller.
        """
        raise UnsupportedOperationError(
            f"the {self.format} reader cannot read {representation!r} payloads directly; it "
            f"reads {sorted(self.payload_representations | {'dense'})}. Convert with "
            f"ds.to_representation({representation!r}) (from dense, exact and checked)"
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release open file handles (they reopen on the next read)."""

    def for_resident_tasks(self) -> Source:
        """The source as a task on resident chunks needs it (they read no bytes).

        A source that carries its data (an in-memory array) returns a stand-in
        with its shape, dtype and identity only, so a query on a persisted
        dataset does not ship the array to the workers with every pass; any
        other source returns itself.
        """
        return self

    def check_block(self, rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """Raise if a block lies outside the scan."""
        R, C = self.shape[:2]
        r0, r1 = rows
        c0, c1 = cols
        if not (0 <= r0 < r1 <= R and 0 <= c0 < c1 <= C):
            raise ShapeError(
                f"scan block rows={rows} cols={cols} is empty or outside the scan of shape "
                f"({R}, {C})"
            )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in list(state):
            if key.startswith("_handle"):
                state[key] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype})"


@dataclasses.dataclass(frozen=True)
class ScanShapeChoice:
    """A resolved scan shape and how it was chosen."""

    shape: tuple[int, int]
    frame_offset: int
    how: str
    note: str | None = None


def _sidecar_candidates(path: Path) -> list[Path]:
    stem = path.name
    for suffix in (
        ".h5",
        ".hdf5",
        ".nxs",
        ".mib",
        ".raw",
        ".xml",
        ".npy",
        ".bin",
        ".zarr",
        ".gtg",
        ".hdr",
        ".seq",
    ):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    out = [path.parent / (path.name + ".json"), path.parent / (stem + ".json")]
    if stem.endswith("_master"):
        out.append(path.parent / (stem[: -len("_master")] + ".json"))
    return [p for i, p in enumerate(out) if p not in out[:i]]


def read_sidecar(path: Path) -> tuple[Path, dict[str, Any]] | None:
    """Return the first JSON sidecar next to ``path`` and its content, if any.

    A sidecar is ``<file>.json`` or ``<stem>.json`` (for Dectris
    ``x_master.h5`` also ``x.json``) holding ``{"scan_shape": [rows, cols]}``
    and optionally ``"calibration": {...}`` (fields of
    :class:`~quantem_flow.calibration.Calibration`).
    """
    import json

    for cand in _sidecar_candidates(path):
        if cand.is_file():
            try:
                content = json.loads(cand.read_text())
            except (OSError, ValueError) as exc:
                raise ParameterError(
                    f"sidecar {str(cand)!r} is not valid JSON ({exc}); fix or remove it"
                ) from exc
            if not isinstance(content, dict):
                raise ParameterError(
                    f"sidecar {str(cand)!r} must hold a JSON object, got {type(content).__name__}"
                )
            return cand, content
    return None


def resolve_scan_shape(
    n_frames: int,
    scan_shape: Sequence[int] | str | None,
    *,
    path: Path | None = None,
    frame_offset: int = 0,
) -> ScanShapeChoice:
    """Decide the scan shape of a flat sequence of frames, never silently.

    Parameters
    ----------
    n_frames
        Frames stored in the file(s).
    scan_shape
        ``(rows, cols)``; ``"square"`` to assume a square scan (recorded as a
        note); ``None`` to look for a JSON sidecar next to ``path``.
    path
        The data file, used to find a sidecar.
    frame_offset
        Frames to skip at the start (for example a detector's flyback
        frames), chosen by the user and recorded.

    Returns
    -------
    ScanShapeChoice
        The shape, the offset and how it was chosen.

    Raises
    ------
    ScanShapeError
        If no shape is given or found, or if ``frame_offset + rows * cols``
        differs from ``n_frames``.
    """
    if frame_offset < 0 or frame_offset >= max(n_frames, 1):
        raise ScanShapeError(
            f"frame_offset must be in [0, {n_frames}) for a file of {n_frames} frames, "
            f"got {frame_offset}"
        )
    usable = n_frames - frame_offset
    how = "given"
    note: str | None = None
    if scan_shape is None and path is not None:
        found = read_sidecar(path)
        if found is not None and "scan_shape" in found[1]:
            scan_shape = found[1]["scan_shape"]
            how = f"sidecar {found[0]}"
    if scan_shape is None:
        root = math.isqrt(usable)
        square = f"; it would be {root} x {root} if square" if root * root == usable else ""
        raise ScanShapeError(
            f"the input holds {usable} frames (after frame_offset={frame_offset}) but no scan "
            f"shape was given{square}. Pass scan_shape=(rows, cols), write a sidecar "
            f"'<file>.json' with {{\"scan_shape\": [rows, cols]}}, or pass scan_shape='square' "
            "to assume a square scan (recorded in provenance)"
        )
    if isinstance(scan_shape, str):
        if scan_shape != "square":
            raise ScanShapeError(
                f"scan_shape must be (rows, cols), 'square' or None, got {scan_shape!r}"
            )
        root = math.isqrt(usable)
        if root * root != usable:
            raise ScanShapeError(
                f"scan_shape='square' needs a square number of frames, but the input holds "
                f"{usable} frames; pass scan_shape=(rows, cols) explicitly"
            )
        shape = (root, root)
        how = "guessed square (scan_shape='square')"
        note = (
            f"scan shape {shape} was assumed square from {usable} frames because "
            "scan_shape='square' was passed; it was not read from the file"
        )
    else:
        seq = [int(v) for v in scan_shape]
        if len(seq) != 2 or min(seq) < 1:
            raise ScanShapeError(f"scan_shape must be two positive integers, got {scan_shape!r}")
        shape = (seq[0], seq[1])
    if shape[0] * shape[1] != usable:
        raise ScanShapeError(
            f"scan shape {shape} needs {shape[0] * shape[1]} frames but the input holds "
            f"{usable} (after frame_offset={frame_offset}); give the scan shape the acquisition "
            "used, or frame_offset=N to skip leading frames"
        )
    return ScanShapeChoice(shape=shape, frame_offset=frame_offset, how=how, note=note)


class FrameSource(Source):
    """A source that stores frames in scan order (row-major over the scan).

    Subclasses call :meth:`_set_frames` once they know the frame count and
    frame shape, and implement :meth:`read_frames`.  The ``out=`` contract is
    kept here for every subclass (third-party readers included): each
    subclass's ``read_frames`` is wrapped so that an ``out`` of another shape,
    or of a dtype the frames would lose values in, is refused
    (:func:`check_frames_out`), and the implementation only ever sees
    ``out=None`` or a C-contiguous array of exactly the frames' shape and
    :attr:`dtype`; any other accepted ``out`` (strided, or wider) is filled by
    copying what it returns.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        impl = cls.__dict__.get("read_frames")
        if impl is not None and not getattr(impl, "_keeps_out_contract", False):
            cls.read_frames = _keeping_out_contract(impl)  # type: ignore[method-assign]

    _scan: ScanShapeChoice
    _frame_shape: tuple[int, int]
    _dtype: np.dtype[Any]
    _n_frames: int

    def _set_frames(
        self,
        *,
        n_frames: int,
        frame_shape: tuple[int, int],
        dtype: np.dtype[Any] | str,
        scan_shape: Sequence[int] | str | None,
        path: Path | None,
        frame_offset: int = 0,
        scan_shape_from: str | None = None,
    ) -> None:
        self._n_frames = int(n_frames)
        self._frame_shape = (int(frame_shape[0]), int(frame_shape[1]))
        self._dtype = np.dtype(dtype).newbyteorder("=")
        self._scan = resolve_scan_shape(
            self._n_frames, scan_shape, path=path, frame_offset=frame_offset
        )
        if scan_shape_from is not None:  # read from the file (a 4-D array), not given
            self._scan = dataclasses.replace(self._scan, how=scan_shape_from)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """Logical shape ``(R_r, R_c, k_r, k_c)``."""
        return (*self._scan.shape, *self._frame_shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """Native-order dtype of the frames."""
        return self._dtype

    @property
    def n_frames(self) -> int:
        """Frames stored in the file(s), including any skipped by ``frame_offset``."""
        return self._n_frames

    @property
    def scan_choice(self) -> ScanShapeChoice:
        """How the scan shape was chosen."""
        return self._scan

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening: the scan shape's, then the reader's own.

        A reader records its own choices (references not applied, frames left
        out...) by appending to ``self._open_notes`` while it opens.
        """
        own: list[str] = getattr(self, "_open_notes", [])
        return [*([self._scan.note] if self._scan.note else []), *own]

    def scan_metadata(self) -> dict[str, Any]:
        """Return the scan-shape part of :attr:`metadata`."""
        return {
            "n_frames": self._n_frames,
            "frame_offset": self._scan.frame_offset,
            "scan_shape_from": self._scan.how,
        }

    def frame_bytes(self, start: int, stop: int) -> tuple[Path, int] | None:
        """Where stored frames ``[start, stop)`` lie as one run of native-order bytes.

        ``(file, byte offset)``, or ``None`` (the default) when they do not.
        """
        return None

    def block_bytes(self, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[Path, int] | None:
        """The run of bytes of a block of whole scan rows or of part of one row."""
        self.check_block(rows, cols)
        C = self._scan.shape[1]
        (r0, r1), (c0, c1) = rows, cols
        if r1 - r0 > 1 and (c0, c1) != (0, C):
            return None
        off = self._scan.frame_offset
        return self.frame_bytes(off + r0 * C + c0, off + (r1 - 1) * C + c1)

    def stored_frames(
        self, start: int, stop: int, *, buffer: np.ndarray | None = None
    ) -> StoredFrames:
        """Stored frames ``[start, stop)`` (absolute) as stored, for :attr:`stored_frames_codec`."""
        raise UnsupportedOperationError(
            f"the {self.format} reader does not read frames as stored (stored_frames_codec "
            "is None); read them with read_frames()"
        )

    def stored_block(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> StoredFrames:
        """Scan block ``rows x cols`` as stored: one frame run per block, or one per row."""
        self.check_block(rows, cols)
        C = self._scan.shape[1]
        off = self._scan.frame_offset
        (r0, r1), (c0, c1) = rows, cols
        if r1 - r0 == 1 or (c0, c1) == (0, C):
            return self.stored_frames(off + r0 * C + c0, off + (r1 - 1) * C + c1, buffer=buffer)
        return concat_stored(
            [self.stored_frames(off + r * C + c0, off + r * C + c1) for r in range(r0, r1)]
        )

    def _check_frame_range(self, start: int, stop: int) -> None:
        """Refuse frames ``[start, stop)`` outside the stored frames."""
        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) lie outside the {self._n_frames} frames of this "
                f"{self.format} source; pass 0 <= start <= stop <= {self._n_frames}"
            )

    def _frames_target(self, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        """Check stored frames ``[start, stop)`` exist; where to put them (``out`` if it fits).

        ``out`` is checked by :func:`check_frames_out`; it is filled in place
        when it is C-contiguous and of :attr:`dtype`, else a new array is
        returned (and :meth:`_delivered` copies it into ``out``).
        """
        self._check_frame_range(start, stop)
        shape = (stop - start, *self._frame_shape)
        check_frames_out(out, shape, self._dtype, what=f"this {self.format} source")
        if out is not None and out.dtype == self._dtype and out.flags.c_contiguous:
            return out
        return np.empty(shape, dtype=self._dtype)

    @staticmethod
    def _delivered(target: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """``target``, copied into ``out`` when ``out`` was given and is another array."""
        if out is not None and target is not out:
            np.copyto(out, target, casting="safe")
            return out
        return target

    @abc.abstractmethod
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read stored frames ``[start, stop)`` (absolute, offset included).

        ``out``, when given, is a C-contiguous ``(stop - start, k_r, k_c)``
        array of :attr:`dtype` to fill; readers that can decode in place
        do, and return it.

        Returns
        -------
        numpy.ndarray
            Shape ``(stop - start, k_r, k_c)``, native byte order.
        """

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Read a scan block by reading whole frame runs (into ``buffer`` if it fits)."""
        self.check_block(rows, cols)
        C = self._scan.shape[1]
        off = self._scan.frame_offset
        r0, r1 = rows
        c0, c1 = cols
        kr, kc = self._frame_shape
        shape = (r1 - r0, c1 - c0, kr, kc)
        if buffer is not None and (
            buffer.shape != shape or buffer.dtype != self._dtype or not buffer.flags.c_contiguous
        ):
            buffer = None
        if (c0, c1) == (0, C):
            frames_out = None if buffer is None else buffer.reshape(-1, kr, kc)
            frames = self.read_frames(off + r0 * C, off + r1 * C, out=frames_out)
            return frames.reshape(shape)
        out = np.empty(shape, dtype=self._dtype) if buffer is None else buffer
        for i, r in enumerate(range(r0, r1)):
            self.read_frames(off + r * C + c0, off + r * C + c1, out=out[i])
        return out


def _keeping_out_contract(
    impl: Callable[..., np.ndarray],
) -> Callable[..., np.ndarray]:
    """``impl`` (a ``read_frames``) behind :func:`check_frames_out` (see :class:`FrameSource`)."""

    @functools.wraps(impl)
    def read_frames(
        self: FrameSource, start: int, stop: int, *, out: np.ndarray | None = None
    ) -> np.ndarray:
        if out is None:
            return impl(self, start, stop)
        self._check_frame_range(start, stop)
        check_frames_out(
            out, (stop - start, *self._frame_shape), self._dtype, what=f"this {self.format} source"
        )
        if out.dtype == self._dtype and out.flags.c_contiguous:
            got = impl(self, start, stop, out=out)
        else:
            got = impl(self, start, stop)
        if got is not out:
            np.copyto(out, got, casting="safe")
        return out

    read_frames._keeps_out_contract = True  # type: ignore[attr-defined]
    return read_frames


def check_frames_out(
    out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype[Any], *, what: str
) -> None:
    """Refuse an ``out=`` for ``read_frames`` that the frames would not fit exactly.

    ``out`` must have the frames' shape (never broadcast into) and a dtype
    the frames' dtype casts to without loss (``numpy.can_cast(..., "safe")``:
    a wider buffer is the caller's explicit choice, a narrower one would wrap
    or round silently).

    Raises
    ------
    ShapeError
        ``out`` has another shape.
    DtypeError
        ``out``'s dtype cannot hold every value of ``dtype``.
    """
    if out is None:
        return
    if out.shape != shape:
        raise ShapeError(
            f"read_frames(out=) of shape {out.shape} for {what}; pass an array of shape {shape}"
        )
    if not np.can_cast(dtype, out.dtype, casting="safe"):
        raise DtypeError(
            f"read_frames(out=) of dtype {out.dtype} cannot hold {what}'s {dtype} values "
            f"without loss; pass an array of dtype {dtype} (or one it casts to safely)"
        )


def calibration_choice(
    path: Path, from_file: Callable[[], tuple[Calibration | None, str | None]]
) -> tuple[Calibration | None, str | None]:
    """The calibration a reader reports and where it came from: a JSON sidecar wins.

    Parameters
    ----------
    path
        The file whose JSON sidecar (:func:`read_sidecar`) is looked for.
    from_file
        Returns the calibration the file itself records and a description of
        where it was read (``(None, None)`` when it records none); called only
        when there is no sidecar calibration.
    """
    side = sidecar_calibration(path)
    if side is not None:
        return side, f"JSON sidecar next to {str(path)!r}"
    return from_file()


def described_calibration(
    found: tuple[Calibration | None, list[str], list[str]], source: str
) -> tuple[Calibration | None, str | None]:
    """``(calibration, "source: what was used; ...")`` from a reader's ``(cal, used, notes)``."""
    cal, used, _ = found
    if cal is None:
        return None, None
    return cal, f"{source}: " + "; ".join(used)


def sidecar_calibration(path: Path) -> Calibration | None:
    """Return the calibration stored in a JSON sidecar next to ``path``, if any."""
    found = read_sidecar(path)
    if found is None or "calibration" not in found[1]:
        return None
    cal = found[1]["calibration"]
    if not isinstance(cal, Mapping):
        raise ParameterError(f"sidecar {str(found[0])!r}: 'calibration' must be an object")
    return Calibration.from_dict(cal)


def drop_unusable_samplings(
    kwargs: dict[str, Any], used: list[str], notes: list[str], what: str
) -> None:
    """Drop samplings that over- or underflowed on unit conversion (never a Calibration error).

    ``kwargs`` are :class:`~quantem_flow.calibration.Calibration` keywords a
    reader built from a file's metadata; a scan or detector sampling that is
    not finite and positive is removed with its units and origin, its entries
    in ``used`` are dropped, and ``notes`` says why (``what`` names the source).
    """
    for kind, label in (("scan", "scan step"), ("detector", "detector pixel")):
        pair = kwargs.get(f"{kind}_sampling")
        if pair is None or all(math.isfinite(v) and v > 0 for v in pair):
            continue
        for key in (f"{kind}_sampling", f"{kind}_units", f"{kind}_origin"):
            kwargs.pop(key, None)
        used[:] = [u for u in used if not u.startswith((label, "optical axis"))]
        notes.append(
            f"the {kind} sampling {pair} converted from {what} is not finite and positive; the "
            f"{kind} was left uncalibrated"
        )


class ResidentOnlySource(Source):
    """A source's description without its data, for tasks on resident chunks.

    Made by :meth:`Source.for_resident_tasks` of sources that carry their data
    (:class:`~quantem_flow.io.memory.ArraySource`).  Shape, dtype, identity,
    notes, metadata and calibration are the original's; reading raises
    :class:`~quantem_flow.errors.UnsupportedOperationError`, since the data
    stayed with the client.
    """

    def __init__(self, original: Source):
        self.format = original.format  # type: ignore[misc]  # the original's, for provenance
        self.native_representation = original.native_representation  # type: ignore[misc]
        self.opened_as = original.opened_as
        self._shape = original.shape
        self._dtype = original.dtype
        self._identity = original.identity
        self._notes = list(original.notes)
        self._metadata = dict(original.metadata)
        self._calibration = original.calibration
        self._original = type(original).__name__

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The original's logical shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The original's dtype."""
        return self._dtype

    @property
    def identity(self) -> SourceIdentity:
        """The original's identity."""
        return self._identity

    @property
    def notes(self) -> list[str]:
        """The original's notes."""
        return list(self._notes)

    @property
    def metadata(self) -> dict[str, Any]:
        """The original's metadata."""
        return dict(self._metadata)

    @property
    def calibration(self) -> Calibration | None:
        """The original's calibration."""
        return self._calibration

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Refuse: the data stayed with the client."""
        raise UnsupportedOperationError(
            f"scan block rows={rows} cols={cols} was asked of a {self._original} that stayed "
            "on the client: tasks on a persisted dataset read its resident chunks, not the "
            "source. If the chunks were lost, persist the dataset again from the client"
        )
