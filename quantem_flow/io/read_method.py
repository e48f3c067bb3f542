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
size: a few rounds over pieces of the chunk being read, alternately one way
and the other, each round one piece per CPU thread at once (page faults of
threads sharing one address space contend, so a one-thread probe favoured
the map here), each piece read and then swept twice as a pass sweeps it (the
content digest, then a kernel's read).  The map is chosen when its fastest
round is at least 5 % faster than ``pread``'s (the fastest, because other
work, a compiler or other tasks, only ever slows a round down).  One probe
runs at a time per process, and every chunk of the file then agrees.  The choice and
both rates are recorded in every chunk's record.  On this project's 2-vCPU
VM ``pread`` wins: a map's page faults cost more than the copy, and the copy
leaves the piece in the core's cache for the two sweeps (benchmarks/RESULTS.md,
"Mapped reads").
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .mapped import mapped_file, supported

__all__ = [
    "READ_METHODS",
    "ReadChoice",
    "checked_read_method",
    "choose_read_method",
    "forget_probes",
]

#: Values of the ``read_method`` setting.
READ_METHODS = ("auto", "mmap", "pread")
#: Rounds each way a probe reads (alternating; one piece per thread and round).
PROBE_PIECES = 4
#: The map must be this much faster (fastest piece time ratio) to be chosen.
MARGIN = 0.95


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
        The probe's read-and-touch rates (``{"mmap": ..., "pread": ...}``),
        empty when nothing was measured.
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


_PROBES: dict[tuple[Any, ...], ReadChoice] = {}
_LOCK = threading.Lock()


def forget_probes() -> None:
    """Forget every measured choice of this process (tests, or after the storage changed)."""
    with _LOCK:
        _PROBES.clear()


def _touch(view: np.ndarray) -> int:
    """Sweep a piece twice, as a pass does: the content digest, then a kernel's read."""
    import xxhash

    xxhash.xxh3_128(memoryview(view.data)).digest()
    whole = view[: view.size // 8 * 8]
    return int(np.add.reduce(whole.view(np.uint64))) if whole.size else 0


def _probe_threads() -> int:
    """Threads a probe reads with: the CPUs this process may use (at most 8), as a pass does."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def _round(path: Path, fd: int, bufs: list[np.ndarray], method: str, at: list[int]) -> float:
    """Seconds for ``len(bufs)`` threads to read and sweep one piece each, at ``at``, one way."""
    piece = bufs[0].size

    def one(i: int) -> None:
        if method == "pread":
            os.preadv(fd, [memoryview(bufs[i].data)], at[i])
            _touch(bufs[i])
        else:
            mapped = mapped_file(path)
            _touch(mapped.piece(at[i], piece))
            mapped.drop(at[i], piece)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(1, len(bufs))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    one(0)
    for th in threads:
        th.join()
    return time.perf_counter() - t


def _probe(path: Path, offset: int, nbytes: int, piece: int) -> ReadChoice:
    n_threads = _probe_threads()
    n = nbytes // piece
    rounds = min(PROBE_PIECES, n // (2 * n_threads))
    if rounds < 1:
        return ReadChoice("pread", f"too few bytes to measure ({nbytes} bytes, pieces of {piece})")
    bufs = [np.zeros(piece, dtype=np.uint8) for _ in range(n_threads)]  # faulted in, as reused
    _touch(bufs[0])  # buffers are; the digest's first call is not timed
    fd = os.open(path, os.O_RDONLY)
    try:
        times: dict[str, list[float]] = {"pread": [], "mmap": []}
        next_piece = 0
        for _ in range(rounds):
            for method in ("pread", "mmap"):
                at = [offset + (next_piece + i) * piece for i in range(n_threads)]
                next_piece += n_threads
                times[method].append(_round(path, fd, bufs, method, at))
    finally:
        os.close(fd)
    # the fastest round of each: other work (a compiler, other tasks) only slows a round down
    rate = {k: n_threads * piece / min(v) / 1e9 for k, v in times.items()}
    faster = min(times["mmap"]) <= MARGIN * min(times["pread"])
    method = "mmap" if faster else "pread"
    return ReadChoice(
        method,
        (
            f"measured on this file by this worker (read, digest, sweep on {n_threads} threads at "
            f"once, as a pass runs): a map {rate['mmap']:.1f} GB/s, pread {rate['pread']:.1f} GB/s "
            f"({rounds} rounds each way of one {piece}-byte piece per thread, alternating); the "
            f"map is used when at least {1 / MARGIN:.2f}x faster"
        ),
        {k: round(v, 3) for k, v in rate.items()},
    )


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
    requested: str, path: Path | None, offset: int, nbytes: int, piece: int
) -> ReadChoice:
    """How to read a chunk's pieces.

    Parameters
    ----------
    requested
        The ``read_method`` setting: ``"auto"`` (measure), ``"mmap"`` or ``"pread"``.
    path
        The file holding the chunk's frames as contiguous bytes, or ``None``
        when they are not (then ``pread``, with the reason).
    offset, nbytes
        The chunk's bytes in the file (a probe reads some of them).
    piece
        Bytes per piece.
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
    with _LOCK:  # one probe at a time: two would slow each other, and every chunk agrees
        found = _PROBES.get(key)
        if found is None:
            found = _probe(path, offset, nbytes, piece)
            if found.measured_GBps:  # a chunk too short to measure does not decide for the file
                _PROBES[key] = found
    return found
