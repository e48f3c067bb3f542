"""Mapped reads: view a file's bytes in place, one piece at a time, then drop the piece's pages.

A streamed chunk pass (:mod:`quantem_flow.graphs.streamed`) may read a piece
of contiguous frames without copying it: through a read-only shared map of
the file, the kernels read the page cache's own pages.  Each piece's pages
leave the process right after the piece ran (``madvise(MADV_DONTNEED)``: the
page-table entries go, the page cache keeps the data), so the worker's
resident set grows by at most the pieces in flight and Dask's memory monitor
sees only what a task holds (the trap that made the readers use ``pread``,
issue 11, item 1, was a map kept while every page stayed resident).

Whether a map beats ``pread`` into a reused buffer depends on the machine,
the file system and whether the file is cached: :mod:`.read_method` measures
both on the file and records the choice.

A file truncated while mapped raises SIGBUS on a read past its new end, which
ends the process.  The size is checked before every piece
(:class:`~quantem_flow.errors.CorruptChunkError` names it), which leaves a
truncation during the piece's own sweeps (about a millisecond per 2 MiB piece):
then the worker process dies, the embedded cluster's supervisor restarts it,
the task runs again and the size check raises the error.  ``pread`` has no
such window, which is one more reason a map is used only where it measures
clearly faster (:mod:`.read_method`), or where ``read_method="mmap"`` asks.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import CorruptChunkError

__all__ = ["MAX_MAPS", "MappedFile", "mapped_file", "supported"]

_PAGE = mmap.PAGESIZE


def supported() -> bool:
    """Whether this platform can drop a map's pages (``madvise`` with ``MADV_DONTNEED``)."""
    return hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")


class MappedFile:
    """One read-only shared map of a whole file (thread-safe; never pickled).

    Holds no file descriptor of its own (the map keeps the one it needs); the
    file's current size is read from the map's descriptor before every piece.

    Parameters
    ----------
    path
        The file.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise CorruptChunkError(
                f"cannot open {str(path)!r} to map it: {exc}; check that it still exists"
            ) from exc
        try:
            st = os.fstat(fd)
            self.stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            self._map = (
                mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                if st.st_size
                else None
            )
        except OSError as exc:
            raise CorruptChunkError(f"cannot map {str(path)!r}: {exc}") from exc
        finally:
            os.close(fd)  # the map holds its own duplicate
        self.size = int(self.stamp[1])

    def _current_size(self) -> int:
        assert self._map is not None
        try:
            return int(self._map.size())  # fstat of the map's own descriptor
        except (OSError, ValueError):  # closed, or the file system refuses: nothing to read
            return 0

    def piece(self, offset: int, nbytes: int, *, what: str = "") -> np.ndarray:
        """A read-only ``uint8`` view of bytes ``[offset, offset + nbytes)``.

        Raises
        ------
        CorruptChunkError
            The file is shorter now than those bytes need (truncated since
            it was mapped).
        """
        end = offset + nbytes
        now = self._current_size() if self._map is not None else 0
        if end > min(now, self.size) or self._map is None:
            raise CorruptChunkError(
                f"{str(self.path)!r} ends at byte {min(now, self.size)}, but bytes "
                f"[{offset}, {end}){' (' + what + ')' if what else ''} were expected: the file "
                f"is {now} bytes now; it was truncated or rewritten after it was opened. "
                "Restore the file and open it again"
            )
        view = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=offset)
        view.flags.writeable = False
        return view

    def drop(self, offset: int, nbytes: int) -> None:
        """Drop the pages that hold ``[offset, offset + nbytes)`` from this process.

        The page cache keeps them; a later read of the same bytes maps them
        again.  A page shared with a neighbouring piece may be dropped while
        another thread reads it: that read maps it again (a fault), with the
        same bytes.
        """
        if self._map is None or nbytes <= 0:
            return
        start = offset // _PAGE * _PAGE
        stop = min(-(-(offset + nbytes) // _PAGE) * _PAGE, -(-self.size // _PAGE) * _PAGE)
        if stop > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def __reduce__(self) -> str | tuple[object, ...]:  # pragma: no cover - never shipped
        raise TypeError("a MappedFile is process state; it is never pickled")


#: Maps kept per process (the most recently used); an evicted map closes once no piece of
#: it is in use (the views keep it alive until then).
MAX_MAPS = 8
_MAPS: collections.OrderedDict[str, MappedFile] = collections.OrderedDict()
_LOCK = threading.Lock()


def mapped_file(path: Path) -> MappedFile:
    """Return this process's map of ``path`` (made again when its inode, size or mtime change)."""
    key = str(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        from ..errors import SourceNotFoundError

        raise SourceNotFoundError(
            f"input file {key!r} disappeared after it was opened; restore it or open the "
            "dataset again"
        ) from exc
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _LOCK:
        found = _MAPS.get(key)
        if found is not None and found.stamp == stamp:
            _MAPS.move_to_end(key)
            return found
        made = MappedFile(path)  # an older map closes when the last piece of it is done
        _MAPS[key] = made
        _MAPS.move_to_end(key)
        while len(_MAPS) > MAX_MAPS:
            _MAPS.popitem(last=False)
        return made
