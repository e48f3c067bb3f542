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
round is at least 15 % faster than ``pread``'s (the fastest, because other
work, a compiler or other tasks, only ever slows a round down; while a kernel
compiles in the process the probe waits for a later chunk), and two probes on
two chunks must both find the map faster: one probe whose ``pread`` rounds
met other work (an exact-NumPy chunk on the other thread) once measured the
map 3x faster here.  Until then, ``pread``; a probe that finds ``pread`` as
fast decides at once (the map could no longer be chosen, so a second probe
would read 128 MiB for nothing).  One probe
runs at a time per process, and every chunk of the file then agrees.  The choice and
both rates are recorded in every chunk's record.  On this project's 2-vCPU
AMD VM ``pread`` won: a map's page faults cost more than the copy, and the copy
leaves the piece in the core's cache for the two sweeps (benchmarks/RESULTS.md,
"Mapped reads").

The same probe chooses the piece size (issue 24: "choose settings by a
start-up probe of the machine, not by constants tuned on one CPU"): each
method is measured with pieces of 1, 2 and 4 times ``stream_piece_mib``
(:data:`PIECE_FACTORS`; every round reads the same bytes per thread), and the
chosen method's fastest size is used where it is at least 10 % faster than
the size asked for.  On the 2-vCPU AMD VM 2 MiB pieces were best; on a 2-vCPU
Intel Xeon (Emerald Rapids, 2 MiB of L2 per core) a pass with 4 or 8 MiB
pieces ran 1.2-1.3x faster than with 2 MiB, by either method
(benchmarks/RESULTS.md, "Piece size by probe").
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptChunkError
from .mapped import MappedFile, supported

__all__ = [
    "READ_METHODS",
    "ReadChoice",
    "checked_read_method",
    "choose_read_method",
    "forget_probes",
]

#: Values of the ``read_method`` setting.
READ_METHODS = ("auto", "mmap", "pread")
#: Rounds each way and piece size a probe reads (alternating).
PROBE_ROUNDS = 3
#: Pieces each thread reads and sweeps per round (thread start-up is amortised over them).
PIECES_PER_THREAD = 4
#: The probe's reused buffers (one piece per thread) stay within this many bytes.
PROBE_BUFFER_BYTES = 64 << 20
#: The map must be this much faster (fastest round time ratio) to replace ``pread``, the
#: default: rounds of one file differ by ~5-10 % from one another on a shared machine.
MARGIN = 1 / 1.15
#: Piece sizes a probe compares, as multiples of the piece asked for (``stream_piece_mib``).
PIECE_FACTORS = (1, 2, 4)
#: A larger piece replaces the one asked for when its fastest round is this much faster.
PIECE_MARGIN = 1 / 1.10


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
        The probe's read-and-touch rates (``{"mmap": ..., "pread": ...}``, each at its
        fastest piece size), empty when nothing was measured.
    piece
        Bytes per piece to read, chosen by the probe among :data:`PIECE_FACTORS` times
        the piece asked for; 0: the piece asked for.
    by_piece
        The probe's rates per method and piece size (``{"mmap": {bytes: GB/s}, ...}``).
    """

    method: str
    why: str
    measured_GBps: dict[str, float] = dataclasses.field(default_factory=dict)
    piece: int = 0
    by_piece: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)

    def piece_bytes(self, asked: int) -> int:
        """Bytes per piece: the probe's choice, else ``asked``."""
        return self.piece or asked

    def record(self) -> dict[str, Any]:
        """JSON-ready form for the chunk record."""
        out: dict[str, Any] = {"method": self.method, "why": self.why}
        if self.measured_GBps:
            out["measured_GBps"] = dict(self.measured_GBps)
        if self.piece:
            out["piece_bytes"] = self.piece
        if self.by_piece:
            out["measured_GBps_by_piece"] = {
                m: {str(p): r for p, r in rates.items()} for m, rates in self.by_piece.items()
            }
        return out


def _best_piece(rates: dict[int, float], asked: int) -> int:
    """The fastest piece size, where at least ``1 / PIECE_MARGIN`` times the one asked for's."""
    if not rates:
        return asked
    best = max(rates, key=lambda p: (rates[p], -p))
    return best if rates[best] * PIECE_MARGIN >= rates.get(asked, 0.0) else asked


_PROBES: dict[tuple[Any, ...], ReadChoice] = {}
_FIRST: dict[tuple[Any, ...], ReadChoice] = {}
#: Probes (on different chunks) that must agree before a file is read through a map.
PROBES = 2
_LOCK = threading.Lock()


def forget_probes() -> None:
    """Forget every measured choice of this process (tests, or after the storage changed)."""
    with _LOCK:
        _PROBES.clear()
        _FIRST.clear()


def _touch(view: np.ndarray) -> int:
    """Sweep a piece twice, as a pass does: the content digest, then a kernel's read."""
    import xxhash

    xxhash.xxh3_128(memoryview(view.data)).digest()
    whole = view[: view.size // 8 * 8]
    return int(np.add.reduce(whole.view(np.uint64))) if whole.size else 0


def _probe_threads(piece: int) -> int:
    """Threads a probe reads with: the CPUs this process may use (at most 8), as a pass does.

    No more than keep the probe's buffers within :data:`PROBE_BUFFER_BYTES`.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8, PROBE_BUFFER_BYTES // max(piece, 1)))


def _round(
    fd: int,
    mapped: MappedFile,
    bufs: list[np.ndarray],
    method: str,
    at: list[list[int]],
    piece: int,
) -> float:
    """Seconds for ``len(bufs)`` threads to read and sweep their ``piece``-byte pieces ``at[i]``."""
    failed: list[BaseException] = []

    def one(i: int) -> None:
        try:
            buf = bufs[i][:piece]
            for offset in at[i]:
                if method == "pread":
                    os.preadv(fd, [memoryview(buf.data)], offset)
                    _touch(buf)
                else:
                    _touch(mapped.piece(offset, piece))
                    mapped.drop(offset, piece)
        except BaseException as exc:  # raised in the caller's thread
            failed.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(1, len(bufs))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    one(0)
    for th in threads:
        th.join()
    if failed:
        raise failed[0]
    return time.perf_counter() - t


def _probe(path: Path, offset: int, nbytes: int, piece: int, start: int = 0) -> ReadChoice:
    """Measure both ways and every piece size on ``[offset, offset + nbytes)``, from ``start`` on.

    Each round reads the same bytes per thread whatever the piece size
    (``PIECES_PER_THREAD`` pieces of the size asked for: 4, 2 or 1 pieces of 1,
    2 or 4 times it), alternating methods and sizes; pieces wrap around the
    region when it is shorter than every round together.
    """
    sizes = [piece * f for f in PIECE_FACTORS]
    n_threads = _probe_threads(sizes[-1])
    per_thread = PIECES_PER_THREAD * piece  # bytes each thread reads per round
    n = nbytes // per_thread  # whole rounds' worth of bytes per thread in the region
    configs = [(m, size) for m in ("pread", "mmap") for size in sizes]
    if n < n_threads or per_thread % sizes[-1]:
        return ReadChoice("pread", f"too few bytes to measure ({nbytes} bytes, pieces of {piece})")
    rounds = PROBE_ROUNDS
    slot = (start // per_thread) % n  # the second probe reads other pieces than the first
    bufs = [np.zeros(sizes[-1], dtype=np.uint8) for _ in range(n_threads)]  # faulted in, as
    _touch(bufs[0])  # reused buffers are; the digest's first call is not timed
    try:
        mapped = MappedFile(path)  # the probe's own map: closed with it, whatever is chosen
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise CorruptChunkError(f"cannot open {str(path)!r} to measure reads: {exc}") from exc
    try:
        times: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        for _ in range(rounds):
            for method, size in configs:
                at = []
                for _i in range(n_threads):
                    base = offset + slot * per_thread
                    at.append([base + j * size for j in range(per_thread // size)])
                    slot = (slot + 1) % n
                times[(method, size)].append(_round(fd, mapped, bufs, method, at, size))
    except OSError as exc:
        raise CorruptChunkError(
            f"reading {str(path)!r} to measure reads failed: {exc}; check the storage"
        ) from exc
    finally:
        os.close(fd)
        del mapped
    # the fastest round of each: other work (a compiler, other tasks) only slows a round down
    by_piece: dict[str, dict[int, float]] = {"pread": {}, "mmap": {}}
    for (method, size), seconds in times.items():
        by_piece[method][size] = round(n_threads * per_thread / min(seconds) / 1e9, 3)
    rate = {m: max(r.values()) for m, r in by_piece.items()}
    method = "mmap" if rate["mmap"] * MARGIN >= rate["pread"] else "pread"
    chosen = _best_piece(by_piece[method], piece)
    return ReadChoice(
        method,
        (
            f"measured on this file by this worker (read, digest, sweep on {n_threads} threads at "
            f"once, as a pass runs): a map {rate['mmap']:.1f} GB/s, pread {rate['pread']:.1f} GB/s "
            f"at their fastest piece size ({rounds} rounds of {per_thread} bytes per thread in "
            f"pieces of {', '.join(str(s) for s in sizes)} bytes, alternating); the map is used "
            f"when at least {1 / MARGIN:.2f}x faster, a larger piece when at least "
            f"{1 / PIECE_MARGIN:.2f}x faster than {piece} bytes: {chosen}-byte pieces"
        ),
        rate,
        piece=chosen,
        by_piece=by_piece,
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
    requested: str,
    path: Path | None,
    offset: int,
    nbytes: int,
    piece: int,
    *,
    defer: bool = False,
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
    defer
        Do not measure now (a kernel is compiling in this process and would slow the
        probe's rounds): ``pread``, and the probe runs on a later chunk.
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
    found = _PROBES.get(key)  # decided: no wait on a probe of another file
    if found is not None:
        return found
    with _LOCK:  # one probe at a time: two would slow each other, and every chunk agrees
        found = _PROBES.get(key)
        if found is not None:
            return found
        if defer:
            return ReadChoice(
                "pread",
                "not measured yet: a kernel was compiling in this worker (it would slow the "
                "probe); measured on a later chunk",
            )
        earlier = _FIRST.get(key)
        # the second probe reads other pieces than the first (not the pages it left cached)
        start = 0 if earlier is None else nbytes // 2
        probe = _probe(path, offset, nbytes, piece, start)
        if not probe.measured_GBps:  # a chunk too short to measure does not decide for the file
            return probe
        _FIRST.pop(key, None)
        if probe.method == "pread":  # one probe for pread decides: the map needs both
            decided = ReadChoice(
                "pread",
                (
                    f"{probe.why}; the map was not, so pread for every chunk of this file "
                    f"(the map needs {PROBES} probes on two chunks to agree)"
                ),
                probe.measured_GBps,
                piece=probe.piece,
                by_piece=probe.by_piece,
            )
        elif earlier is None:  # one probe can be hit by other work: a second one, later, decides
            _FIRST[key] = probe
            return ReadChoice(
                "pread",
                f"first of {PROBES} probes ({probe.why}); pread until the next one agrees",
                probe.measured_GBps,
                piece=_best_piece(probe.by_piece.get("pread", {}), piece),
                by_piece=probe.by_piece,
            )
        else:
            both = {
                m: {
                    size: max(rate, earlier.by_piece.get(m, {}).get(size, 0.0))
                    for size, rate in rates.items()
                }
                for m, rates in probe.by_piece.items()
            }
            decided = ReadChoice(
                "mmap",
                (
                    f"{PROBES} probes on this file by this worker, on two chunks: "
                    f"{earlier.measured_GBps} then {probe.measured_GBps} GB/s; both found the map "
                    f"at least {1 / MARGIN:.2f}x faster than pread (read, digest and sweep on "
                    "every CPU thread at once)"
                ),
                {
                    k: round(max(earlier.measured_GBps[k], probe.measured_GBps[k]), 3)
                    for k in probe.measured_GBps
                },
                piece=_best_piece(both.get("mmap", {}), piece),
                by_piece=both,
            )
        _PROBES[key] = decided
        return decided
