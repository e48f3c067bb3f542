"""Positional reads into caller buffers, without memory maps.

Readers of flat binary files (``.npy``, raw, Merlin, EMPAD) read stored
bytes with ``pread`` straight into the array they fill (a staging buffer or
memory a chunk will own).  They never keep a memory map of the file: every
page of a map that a pass touches stays resident in the process
(``RssFile``), Dask counts it as worker memory, pauses the worker at its
pause fraction and, since nothing the worker does releases those pages,
never resumes it (issue 11, item 1).  Pages read with ``pread`` live in the
kernel's page cache, which is shared, reclaimable and not part of any
process's resident set.  A streamed pass may instead view one piece at a
time through a map whose pages it drops right after the piece
(:mod:`quantem_flow.io.mapped`), where that measures faster
(:mod:`quantem_flow.io.read_method`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptChunkError

__all__ = ["PositionalFile", "PositionalFiles"]

#: Bytes of records read per ``pread`` when headers or footers must be skipped.
SCRATCH_BYTES = 4 << 20


class PositionalFile:
    """One read-only file, read at explicit offsets (thread-safe).

    Holds an open unbuffered file; it is not picklable on purpose: sources
    keep it under a ``_handle`` attribute, which they drop when pickled and
    reopen lazily in the process that reads.
    """

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            self._fh = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        except FileNotFoundError as exc:
            from ..errors import SourceNotFoundError

            raise SourceNotFoundError(
                f"input file {str(path)!r} disappeared after it was opened; restore it or "
                "open the dataset again"
            ) from exc
        except OSError as exc:
            raise CorruptChunkError(
                f"cannot reopen {str(path)!r} for reading: {exc}; check that it still exists "
                "and is readable"
            ) from exc

    def __reduce__(self) -> Any:  # pragma: no cover - sources drop handles before pickling
        return (PositionalFile, (self.path,))

    def size(self) -> int:
        """Current size of the file in bytes."""
        return os.fstat(self._fh.fileno()).st_size

    def readinto(self, offset: int, out: np.ndarray, *, what: str = "") -> np.ndarray:
        """Fill the C-contiguous array ``out`` with the bytes at ``offset``.

        Raises
        ------
        CorruptChunkError
            The file ends before ``offset + out.nbytes`` (truncated since it
            was opened) or the operating system reports a read error; the
            message names the file, the byte range and ``what`` was read.
        """
        if not out.flags.c_contiguous:
            raise ValueError("PositionalFile.readinto needs a C-contiguous array")
        mv = memoryview(out.reshape(-1).view(np.uint8).data)
        n = len(mv)
        done = 0
        fd = self._fh.fileno()
        while done < n:
            try:
                if hasattr(os, "preadv"):
                    got = os.preadv(fd, [mv[done:]], offset + done)
                else:  # pragma: no cover - Windows: no positional read into a buffer
                    with self._lock:
                        self._fh.seek(offset + done)
                        got = self._fh.readinto(mv[done:]) or 0
            except OSError as exc:
                raise CorruptChunkError(
                    f"reading bytes [{offset}, {offset + n}) of {str(self.path)!r}"
                    f"{' (' + what + ')' if what else ''} failed at byte {offset + done}: {exc}; "
                    "check the storage (a network file system or a failing disk)"
                ) from exc
            if got == 0:
                raise CorruptChunkError(
                    f"{str(self.path)!r} ends at byte {offset + done}, but bytes "
                    f"[{offset}, {offset + n}){' (' + what + ')' if what else ''} were expected: "
                    f"the file is {self.size()} bytes now; it was truncated or rewritten after "
                    "it was opened. Restore the file and open it again"
                )
            done += got
        return out

    def read_records(
        self,
        offset: int,
        out: np.ndarray,
        *,
        record: int,
        head: int,
        what: str = "",
    ) -> np.ndarray:
        """Fill ``out`` (``(n, ...)`` frames) from ``n`` records of ``record`` bytes.

        Each record holds ``head`` bytes to skip, one frame of
        ``out[0].nbytes`` bytes, then whatever is left of ``record``.
        Records are read a few MiB at a time into a scratch buffer.
        """
        n = int(out.shape[0])
        frame = int(out[0].nbytes) if n else 0
        if n == 0:
            return out
        flat = out.reshape(n, -1).view(np.uint8)
        per = max(1, SCRATCH_BYTES // record)
        scratch = np.empty(min(n, per) * record, dtype=np.uint8)
        for i in range(0, n, per):
            k = min(per, n - i)
            part = scratch[: k * record]
            self.readinto(offset + i * record, part, what=what)
            flat[i : i + k] = part.reshape(k, record)[:, head : head + frame]
        return out

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

    def __del__(self) -> None:
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()


class PositionalFiles:
    """The files of one source, each opened as a :class:`PositionalFile` on its first read.

    For readers of several files (K2 IS sectors, FRMS6 parts, raw_csr's
    arrays).  Like a single :class:`PositionalFile` it is kept under a
    ``_handle`` attribute, dropped when the source is pickled; threads
    reading at once share one handle per file.
    """

    def __init__(self) -> None:
        self._open: dict[Path, PositionalFile] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> PositionalFile:
        """The open file at ``path`` (opened now if it is not yet)."""
        with self._lock:
            found = self._open.get(path)
            if found is None:
                found = PositionalFile(path)
                self._open[path] = found
            return found

    def close(self) -> None:
        """Close every file opened (a later :meth:`get` opens it again)."""
        with self._lock:
            opened, self._open = list(self._open.values()), {}
        for f in opened:
            f.close()
