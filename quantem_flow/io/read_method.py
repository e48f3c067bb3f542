"""How a streamed pass reads a file's contiguous frames: ``pread`` or a map, chosen by measurement.

Two ways read a piece of a page-cached file:

- ``pread`` into a reused buffer (:class:`~quantem_flow.io.fileio.PositionalFile`):
  one copy into a buffer the kernels then read from cache;
- a map (:class:`~quantem_flow.io.mapped.MappedFile`): no copy, the kernels
  read the page cache's pages, which are dropped after the piece.

Which is faster depends on the machine (page-fault cost, copy bandwidth),
the file system (a network file system faults slowly) and whether the file
is cached, so with ``read_method="auto"`` (:mod:`quantem_flow.config`) each
worker process measures both on the file it reads, once per file and piece
size, **with the pass itself**: the first chunks of the file it streams are
*trials* (:class:`ReadTrial`), whose pieces are read one way or the other in
turns of :data:`TURN_S` seconds of a clock every thread of the process shares
(so while one thread reads through the map the others mostly do too: page
faults of threads sharing one address space contend, and a one-thread
measurement favoured the map here), each piece timed with its digest and
kernels.  Nothing is read twice and nothing extra is read: the trial's pieces
are the pass's (an earlier design read 2 x 128 MiB of each file apart from
the pass, 0.08-0.17 s per process and file).  The map is chosen when the
lower quartile of its pieces' times per byte is at least 15 % below
``pread``'s (a low quantile: other work, a compiler or other tasks, only
ever slows a piece down; not the minimum: one lucky piece does not decide),
and :data:`TRIALS` trials on different chunks must agree; until then, and
while a kernel compiles in the process (a chunk then reads with ``pread``
and tries later), ``pread``.  Every chunk records which it used and why,
and a trial both rates.  On this project's 2-vCPU VM ``pread`` wins: a map's
page faults cost more than the copy, and the copy leaves the piece in the
core's cache for the two sweeps (benchmarks/RESULTS.md, "Mapped reads").
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .mapped import supported

__all__ = [
    "READ_METHODS",
    "ReadChoice",
    "ReadTrial",
    "checked_read_method",
    "choose_read_method",
    "forget_probes",
]

#: Values of the ``read_method`` setting.
READ_METHODS = ("auto", "mmap", "pread")
#: Seconds of each turn of a trial (one way, then the other; the clock is the process's).
TURN_S = 0.002
#: Pieces a trial must have timed each way to count (a shorter chunk reads and says so).
MIN_PIECES_EACH = 4
#: Trials on different chunks that must agree before a file is read through a map.
TRIALS = 2
#: The map must be this much faster (lower-quartile time ratio) to replace ``pread``, the
#: default: pieces of one file differ by ~5-10 % from one another on a shared machine.
MARGIN = 1 / 1.15


@dataclasses.dataclass(frozen=True)
class ReadChoice:
    """The read method of a file's streamed pieces, and why.

    Attributes
    ----------
    method
        ``"mmap"`` or ``"pread"``.
    why
        A sentence for the chunk record.
    measured_GBps
        The trials' rates, per thread, of a piece's read, digest and kernels
        (``{"mmap": ..., "pread": ...}``), empty when nothing was measured.
    """

    method: str
    why: str
    measured_GBps: dict[str, float] = dataclasses.field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """JSON-ready form for the chunk record."""
        out: dict[str, Any] = {"method": self.method, "why": self.why}
        if self.measured_GBps:
            out["measured_GBps"] = dict(self.measured_GBps)
        return out


_DECIDED: dict[tuple[Any, ...], ReadChoice] = {}
_TRIED: dict[tuple[Any, ...], list[dict[str, float]]] = {}
_LOCK = threading.Lock()


def forget_probes() -> None:
    """Forget every measured choice of this process (tests, or after the storage changed)."""
    with _LOCK:
        _DECIDED.clear()
        _TRIED.clear()


def _turn_now() -> str:
    """The way the process's trials read now: turns of :data:`TURN_S`, the same in every thread."""
    return "mmap" if (time.perf_counter_ns() // int(TURN_S * 1e9)) % 2 else "pread"


class ReadTrial:
    """A chunk whose pieces are read both ways, each timed with its digest and kernels.

    The pass asks :meth:`method` before each piece, reads it that way, and
    reports the piece's seconds with :meth:`add`; :meth:`finish` counts the
    trial towards the file's decision and gives the chunk's record.

    Parameters
    ----------
    key
        The file and piece size the decision is kept under.
    """

    method_now = staticmethod(_turn_now)

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self._seconds_per_byte: dict[str, list[float]] = {"pread": [], "mmap": []}

    def method(self) -> str:
        """``"pread"`` or ``"mmap"``: how to read the next piece."""
        return self.method_now()

    def add(self, method: str, seconds: float, nbytes: int) -> None:
        """A piece read ``method``, then digested and run through the kernels, in ``seconds``."""
        if nbytes > 0 and seconds > 0:
            self._seconds_per_byte[method].append(seconds / nbytes)

    def rates(self) -> dict[str, float]:
        """GB/s per thread of each way's lower-quartile piece (empty if too few pieces)."""
        if min(len(v) for v in self._seconds_per_byte.values()) < MIN_PIECES_EACH:
            return {}
        return {
            k: round(1.0 / float(np.quantile(v, 0.25)) / 1e9, 3)
            for k, v in self._seconds_per_byte.items()
        }

    def finish(self) -> ReadChoice:
        """Count this trial towards the file's decision; the chunk's record.

        Returns
        -------
        ReadChoice
            ``method`` ``"pread+mmap"`` (pieces were read both ways), with
            this trial's rates and where the file's decision stands.
        """
        rates = self.rates()
        counts = {k: len(v) for k, v in self._seconds_per_byte.items()}
        if not rates:
            return ReadChoice(
                "pread+mmap",
                f"a trial of both ways, too short to count ({counts['pread']} pieces by pread, "
                f"{counts['mmap']} through a map; {MIN_PIECES_EACH} each are needed)",
            )
        turns = (
            f"pieces read in turns of {TURN_S * 1e3:g} ms by pread or through a map, each timed "
            f"with its digest and kernels ({counts['pread']} and {counts['mmap']} pieces)"
        )
        with _LOCK:
            tried = _TRIED.setdefault(self.key, [])
            tried.append(rates)
            decided = _DECIDED.get(self.key)
            if decided is None and len(tried) >= TRIALS:
                faster = [r["mmap"] * MARGIN >= r["pread"] for r in tried[-TRIALS:]]
                decided = ReadChoice(
                    "mmap" if all(faster) else "pread",
                    (
                        f"{TRIALS} trials on this file by this worker, on different chunks "
                        f"(GB/s per thread of read, digest and kernels): "
                        + ", then ".join(str(r) for r in tried[-TRIALS:])
                        + f"; the map is used only when every trial finds it at least "
                        f"{1 / MARGIN:.2f}x faster than pread"
                    ),
                    {k: max(r[k] for r in tried[-TRIALS:]) for k in rates},
                )
                _DECIDED[self.key] = decided
        standing = (
            f"the file now reads by {decided.method}"
            if decided is not None
            else f"trial {len(tried)} of {TRIALS} on this file"
        )
        return ReadChoice("pread+mmap", f"{turns}; {standing}", rates)


def checked_read_method(value: str) -> str:
    """``value`` if it is a ``read_method`` setting, else the project's error naming the choices."""
    if value not in READ_METHODS:
        from ..errors import ParameterError

        raise ParameterError(
            f"read_method must be one of {READ_METHODS}, got {value!r}: 'auto' measures a map "
            "against pread on each file"
        )
    return value


def choose_read_method(
    requested: str,
    path: Path | None,
    nbytes: int,
    piece: int,
    *,
    defer: bool = False,
) -> ReadChoice | ReadTrial:
    """How to read a chunk's pieces: one way, or both as a trial.

    Parameters
    ----------
    requested
        The ``read_method`` setting: ``"auto"`` (measure), ``"mmap"`` or ``"pread"``.
    path
        The file holding the chunk's frames as contiguous bytes, or ``None``
        when they are not (then ``pread``, with the reason).
    nbytes
        The chunk's bytes (its pieces are the trial's).
    piece
        Bytes per piece.
    defer
        Do not measure now (a kernel is compiling in this process and would slow the
        trial's pieces): ``pread``, and a later chunk tries both ways.

    Returns
    -------
    ReadChoice or ReadTrial
        A trial while ``"auto"`` has not decided for this file and piece size
        and the chunk has enough pieces to count.
    """
    checked_read_method(requested)
    if requested == "pread":
        return ReadChoice("pread", "read_method='pread' was set")
    if path is None:
        return ReadChoice(
            "pread",
            "the frames are not one run of stored bytes in native order (records with "
            "headers, another byte order, a cropped or binned view, compressed or chunked)",
        )
    if not supported():
        return ReadChoice("pread", "this platform cannot drop a map's pages (no madvise)")
    if requested == "mmap":
        return ReadChoice("mmap", "read_method='mmap' was set")
    try:
        st = os.stat(path)
    except OSError:
        return ReadChoice("pread", "the file could not be examined; pread names what is wrong")
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, piece)
    found = _DECIDED.get(key)
    if found is not None:
        return found
    if defer:
        return ReadChoice(
            "pread",
            "not measured yet: a kernel was compiling in this worker (it would slow the "
            "trial's pieces); a later chunk tries both ways",
        )
    if nbytes // max(piece, 1) < 4 * MIN_PIECES_EACH:
        return ReadChoice(
            "pread",
            f"too few pieces to try both ways ({nbytes} bytes, pieces of {piece}); a longer "
            "chunk tries them",
        )
    return ReadTrial(key)
