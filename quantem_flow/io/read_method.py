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
the map here), each piece read and then swept as the pass will sweep it:
twice (the content digest, then a kernel's read) where the digest is a sweep
of its own, once where the kernel carries the digest in its sweep
(docs/digest-in-kernel.md: the hash then reads what the kernel just brought
into cache, at the same cost whichever way the piece was read), and the map
in the pieces the pass maps (``map_piece_mib`` where the piece is swept
once).  The kernel's read is the pass's own kernels where its runtime's
stream can sweep frames without feeding them (``FramePassStream.sweep``),
else a sum of the bytes: a kernel slower than memory hides what the map's
reads from memory cost beyond the copy's, and a fast sum does not (on the
AVX2 VM of the thirteenth stop the sum chose ``pread`` for a ``.npy`` whose
pass ran 1.15x faster by map).  A way is chosen when its fastest round is at
least 15 % faster than the other's (the fastest, because other work
elsewhere only ever slows a round down); within that, the way every pass
measured so far found faster for that sweep (:func:`_decide`: the map where
the kernels carry the digest, ``pread`` where it is a sweep of its own).  A verdict takes two probes
on different pieces of the file, comparing the fastest round each way over
both: one probe whose ``pread`` rounds met other work (an exact-NumPy chunk
on the other thread) once measured the map 3x faster here, and a single
probe finding ``pread`` as fast once kept an HDF5 file on ``pread`` (1.6x
slower) for a worker's life (benchmarks/RESULTS.md, issue 24, tenth stop).
The probe also reads ``pread`` in a second, larger piece (:data:`PREAD_LARGER`
times the pass's, within what admission counted for a task's piece) as a third
way in every round; a file read by ``pread`` is read in the larger pieces unless
the setting's read at least ``1 / SIZE_MARGIN`` times faster
(:attr:`ReadChoice.piece_bytes`; larger pieces spread the kernel's calls and
the Python around each piece, more of it in a pass than in a probe, smaller
ones keep the copy in cache: which wins is the machine's).  The two probes run
back to back, while the worker's other tasks reading the file wait for the
verdict: a second probe made later, on another chunk, ran
beside the first chunk's kernels, and on the AVX2 VM of the thirteenth stop
a worker kept an HDF5 file on ``pread`` at 0.6x the map's pass.  Other
threads of the process are watched too: a round during which they used more
than :data:`BUSY_OTHERS` of a CPU (the process's CPU time less the probe
threads' own) does not count, and a probe with no such quiet round either way
decides nothing (``pread`` for that chunk, measured on a later one; after
:data:`BUSY_TRIES` such chunks every round counts, and the record says so);
while a kernel compiles in the process the probe waits for a later chunk.
Until a verdict, ``pread``.  One probe runs at a time per process, and every
chunk of the file then agrees.  The choice and both rates are recorded in
every chunk's record.  With the digest as a sweep
of its own, ``pread`` won on this project's AMD VM: a map's page faults cost
more than the copy, and the copy leaves the piece in the core's cache for the
two sweeps (benchmarks/RESULTS.md, "Mapped reads"); with the digest in the
kernel's sweep the map won by 1.35-1.63x on the Intel VM (issue 24, tenth stop).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
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
#: Rounds each way a probe of two ways reads (alternating); with a third way (a larger
#: ``pread`` piece) each way reads fewer, so a probe reads about as much as two ways did.
PROBE_ROUNDS = 4
#: Pieces each thread reads and sweeps per round (thread start-up is amortised over them).
PIECES_PER_THREAD = 4
#: The probe's reused buffers (one piece per thread) stay within this many bytes.
PROBE_BUFFER_BYTES = 64 << 20
#: Multiple of the configured ``pread`` piece a probe also reads ``pread`` pieces in, where a
#: task's piece may hold that many bytes (``piece_cap``: what admission counted for it).
PREAD_LARGER = 4
#: ``pread`` reads in the largest piece whose fastest round was within this factor of the
#: fastest piece's (the same bytes each way, the pass's own sweep): larger pieces spread each
#: piece's fixed cost (the call, the kernel's entry, the Python around it, more of it in a
#: pass than in a probe), smaller ones keep the copy in a core's cache for the sweep; which
#: wins is the machine's (8 MiB pieces ran passes 1.06-1.31x faster than 2 MiB on this
#: project's two VMs, while their probes found them within 5 %).
SIZE_MARGIN = 1 / 1.05
#: A way must be this much faster (fastest round time ratio) to be chosen over the other
#: (within it, :func:`_decide`'s tie rule): rounds of one file differ by ~5-10 % from one
#: another on a shared machine.
MARGIN = 1 / 1.15
#: A probe round counts only while the process's other threads used at most this fraction
#: of one CPU over it, beyond what the probe's threads' hand-offs cost (measured by rounds
#: that read nothing).  Quiet rounds here: 2-21 % before that allowance; with one other
#: thread summing arrays: 36-92 %.
BUSY_OTHERS = 0.3


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
        The probe's read-and-touch rates (``{"mmap": ..., "pread": ...}``; ``pread``'s
        the faster of its piece sizes), empty when nothing was measured.
    piece_bytes
        Bytes per ``pread`` piece the probe chose for the pass, or 0: the pass's own
        piece (``stream_piece_mib``; a map reads pieces of ``map_piece_mib``).
    pread_GBps
        ``pread``'s rate per piece size the probe read (``{bytes: GB/s}``), where it read
        more than one.
    """

    method: str
    why: str
    measured_GBps: dict[str, float] = dataclasses.field(default_factory=dict)
    piece_bytes: int = 0
    pread_GBps: dict[int, float] = dataclasses.field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """JSON-ready form for the chunk record."""
        out: dict[str, Any] = {"method": self.method, "why": self.why}
        if self.measured_GBps:
            out["measured_GBps"] = dict(self.measured_GBps)
        if self.piece_bytes:
            out["piece_bytes"] = self.piece_bytes
        if self.pread_GBps:
            out["pread_GBps_by_piece_bytes"] = {str(k): v for k, v in self.pread_GBps.items()}
        return out


_PROBES: dict[tuple[Any, ...], ReadChoice] = {}
_BUSY_TRIES: dict[tuple[Any, ...], int] = {}
#: Probes (back to back, on different pieces of the file) a file's read method is decided
#: from: the fastest round each way over all of them.
PROBES = 2
#: Chunks whose probe found this worker's other threads busy in every round of a way
#: before a probe counts busy rounds too (and says so).
BUSY_TRIES = 3
_LOCK = threading.Lock()
#: How a probe that met other threads' work in every round of a way begins its answer.
_BUSY = "not measured: other threads of this worker"


def forget_probes() -> None:
    """Forget every measured choice of this process (tests, or after the storage changed)."""
    with _LOCK:
        _PROBES.clear()
        _BUSY_TRIES.clear()


#: What sweeps a probe's piece (its bytes as ``uint8``) as the pass's kernels would.
Sweep = Callable[[np.ndarray], None]


def _touch(view: np.ndarray, sweeps: int = 2, kernels: Sweep | None = None) -> int:
    """Sweep a piece as a pass does: the content digest (``sweeps == 2``), then a kernel's read.

    ``kernels``: the pass's own (see :func:`choose_read_method`), else a sum of the bytes.
    """
    import xxhash

    if sweeps == 2:
        xxhash.xxh3_128(memoryview(view.data)).digest()
    if kernels is not None:
        kernels(view)
        return 0
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


class _Readers:
    """Threads that read a round of pieces together, started once per probe.

    Threads started per round would put their start-up in the round's time and
    in the process's CPU time; these wait on a barrier between rounds.
    """

    def __init__(self, n_threads: int) -> None:
        self._begin = threading.Barrier(n_threads)
        self._end = threading.Barrier(n_threads)
        self._job: Callable[[int], None] | None = None
        self._own = [0.0] * n_threads
        self._failed: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), daemon=True)
            for i in range(1, n_threads)
        ]
        for th in self._threads:
            th.start()

    def _serve(self, i: int) -> None:
        while True:
            self._begin.wait()
            if self._job is None:
                return
            self._run(i, self._job)
            self._end.wait()

    def _run(self, i: int, job: Callable[[int], None]) -> None:
        start = time.thread_time()
        try:
            job(i)
        except BaseException as exc:  # raised in the caller's thread
            self._failed.append(exc)
        self._own[i] = time.thread_time() - start

    def round(self, job: Callable[[int], None]) -> tuple[float, float]:
        """Run ``job(i)`` on every thread ``i`` at once.

        Returns the round's seconds and the CPU seconds the process's *other* threads
        used meanwhile (its CPU time less these threads' own).
        """
        self._job = job
        self._failed.clear()
        cpu = time.process_time()
        t = time.perf_counter()
        self._begin.wait()
        self._run(0, job)
        self._end.wait()
        wall = time.perf_counter() - t
        others = max(0.0, time.process_time() - cpu - sum(self._own))
        if self._failed:
            raise self._failed[0]
        return wall, others

    def close(self) -> None:
        """End the threads."""
        self._job = None
        self._begin.wait()
        for th in self._threads:
            th.join()


def _reading(
    fd: int,
    mapped: MappedFile,
    bufs: list[np.ndarray],
    method: str,
    at: list[list[int]],
    sweeps: int,
    piece: int,
    kernels: Sweep | None = None,
) -> Callable[[int], None]:
    """Thread ``i``'s part of a round: read and sweep its pieces ``at[i]``, one way.

    ``piece``: bytes per piece (the buffers' size for ``pread``; a mapped piece may be larger).
    """

    def one(i: int) -> None:
        for offset in at[i]:
            if method == "pread":
                os.preadv(fd, [memoryview(bufs[i].data)], offset)
                _touch(bufs[i], sweeps, kernels)
            else:
                _touch(mapped.piece(offset, piece), sweeps, kernels)
                mapped.drop(offset, piece)

    return one


def _pread_sizes(piece: int, piece_cap: int) -> list[int]:
    """The ``pread`` piece sizes a probe reads: the pass's own, and a larger one where it fits.

    The larger is :data:`PREAD_LARGER` times the piece, at most ``piece_cap`` (the bytes a
    task's piece may hold, as admission counted it), in whole multiples of the piece.
    """
    larger = min(PREAD_LARGER * piece, piece_cap // max(piece, 1) * piece)
    return [piece, larger] if larger > piece else [piece]


def _probe(
    path: Path,
    offset: int,
    nbytes: int,
    piece: int,
    start: int = 0,
    sweeps: int = 2,
    map_piece: int = 0,
    *,
    count_busy: bool = False,
    kernels: Sweep | None = None,
    piece_cap: int = 0,
) -> ReadChoice:
    """Measure both ways on ``[offset, offset + nbytes)``, from byte ``offset + start`` on.

    Each thread reads a run of ``span`` bytes per round: ``pread`` in pieces of
    ``piece`` and, where ``piece_cap`` allows, of a larger size too
    (:func:`_pread_sizes`), the map in pieces of ``map_piece`` where larger (as the pass
    maps them).  Rounds during which the process's other threads used more than
    :data:`BUSY_OTHERS` of a CPU do not count unless ``count_busy``; where every round of
    a way was such a round, nothing is measured (the answer says so).
    """
    pread_sizes = _pread_sizes(piece, piece_cap)
    ways = {f"pread {size}": ("pread", size) for size in pread_sizes}
    ways["mmap"] = ("mmap", max(piece, map_piece))
    n_threads = _probe_threads(max(pread_sizes))
    span = max(PIECES_PER_THREAD * piece, *(size for _, size in ways.values()))
    per_round = n_threads * span
    # a first compute pays for its probes (two per file and process): about as many bytes
    # whatever the number of ways
    rounds = min(-(-2 * PROBE_ROUNDS // len(ways)), nbytes // (len(ways) * per_round))
    if rounds < 1:
        return ReadChoice(
            "pread",
            f"too few bytes to measure ({nbytes} bytes, runs of {span} bytes per thread)",
        )
    used = len(ways) * rounds * per_round
    first = start if start + used <= nbytes else 0
    # faulted in, as reused buffers are (one per thread, of the largest pread piece)
    bufs = [np.zeros(max(pread_sizes), dtype=np.uint8) for _ in range(n_threads)]
    _touch(bufs[0], 2, kernels)  # the first calls of digest and kernels are not timed
    try:
        mapped = MappedFile(path)  # the probe's own map: closed with it, whatever is chosen
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise CorruptChunkError(f"cannot open {str(path)!r} to measure reads: {exc}") from exc
    readers = _Readers(n_threads)
    try:
        # what the threads' hand-offs between rounds cost the process by themselves
        # (0.1-0.2 ms here): not other work
        idle = min(readers.round(lambda i: None)[1] for _ in range(3))
        times: dict[str, list[float]] = {way: [] for way in ways}
        others: dict[str, list[float]] = {way: [] for way in ways}
        at_byte = first
        for _ in range(rounds):
            for way, (method, size) in ways.items():
                at = [
                    [offset + at_byte + i * span + j * size for j in range(span // size)]
                    for i in range(n_threads)
                ]
                at_byte += per_round
                views = [b[:size] for b in bufs]
                wall, busy = readers.round(
                    _reading(fd, mapped, views, method, at, sweeps, size, kernels)
                )
                times[way].append(wall)
                others[way].append(busy)
    except OSError as exc:
        raise CorruptChunkError(
            f"reading {str(path)!r} to measure reads failed: {exc}; check the storage"
        ) from exc
    finally:
        readers.close()
        os.close(fd)
        del mapped
    # rounds during which other threads of this process worked do not count (they share the
    # CPUs); of the rest, the fastest: other work elsewhere only ever slows a round down
    quiet = {
        k: [
            t
            for t, busy in zip(v, others[k], strict=True)
            if count_busy or busy - idle <= BUSY_OTHERS * t
        ]
        for k, v in times.items()
    }
    dropped = sum(len(v) - len(quiet[k]) for k, v in times.items())
    busiest = max(
        max(0.0, b - idle) / t for k, v in times.items() for t, b in zip(v, others[k], strict=True)
    )
    if not all(quiet.values()):
        return ReadChoice(
            "pread",
            (
                f"{_BUSY} kept {busiest:.0%} of a CPU busy "
                f"during the probe's rounds ({dropped} of {len(ways) * rounds} rounds over "
                f"{BUSY_OTHERS:.0%}), which would slow them; measured on a later chunk"
            ),
        )
    rate = {
        way: n_threads * (span // size) * size / min(quiet[way]) / 1e9
        for way, (_, size) in ways.items()
    }
    by_size = {size: round(rate[f"pread {size}"], 3) for size in pread_sizes}
    measured = {"mmap": rate["mmap"], "pread": max(by_size.values())}
    method, rule = _decide(measured, sweeps)
    chosen, size_rule = _pread_piece(by_size, piece)
    what = _sweep_words(sweeps, by_kernels=kernels is not None)
    skipped = (
        f"; counting rounds during which other threads of this worker used up to "
        f"{busiest:.0%} of a CPU, after {BUSY_TRIES} chunks found them busy"
        if count_busy
        else f"; {dropped} round(s) during which other threads of this worker used over "
        f"{BUSY_OTHERS:.0%} of a CPU not counted"
        if dropped
        else ""
    )
    pread_words = " and ".join(f"{size}-byte" for size in pread_sizes)
    return ReadChoice(
        method,
        (
            f"measured on this file by this worker ({what} on {n_threads} threads at "
            f"once, as a pass runs): a map {measured['mmap']:.1f} GB/s, pread "
            f"{measured['pread']:.1f} GB/s ({rounds} rounds each way of {span} bytes per "
            f"thread, pread in {pread_words} pieces, the map in {ways['mmap'][1]}-byte pieces, "
            f"alternating{skipped}); {rule}"
            + (f"; {size_rule}" if len(by_size) > 1 and method == "pread" else "")
        ),
        {k: round(v, 3) for k, v in measured.items()},
        piece_bytes=chosen if method == "pread" and chosen != piece else 0,
        pread_GBps=by_size if len(by_size) > 1 else {},
    )


def _pread_piece(by_size: dict[int, float], piece: int) -> tuple[int, str]:
    """The ``pread`` piece a probe's rates choose (``{bytes: GB/s}``), and the rule.

    The largest piece whose fastest round was within ``SIZE_MARGIN`` of the fastest
    size's: the passes measured so far ran faster in larger ``pread`` pieces than their
    probes showed (the Python and calls around each piece are the pass's, not the
    probe's: 8 MiB pieces 1.06-1.31x 2 MiB in passes whose probes found them within 5 %),
    so a smaller piece is kept only where it read clearly faster (a machine whose caches
    the larger copy no longer fits).
    """
    lead = 1 / SIZE_MARGIN
    if not by_size:
        return piece, f"pread pieces of {piece} bytes (the setting's)"
    fastest = max(by_size.values())
    chosen = max(size for size, rate in by_size.items() if rate >= SIZE_MARGIN * fastest)
    rates = ", ".join(f"{k}: {v:.3g}" for k, v in by_size.items())
    if chosen == piece:
        return piece, (
            f"pread pieces of {piece} bytes (the setting's), as no larger piece read within "
            f"{lead:.2f}x of it ({rates} GB/s)"
        )
    return chosen, (
        f"pread pieces of {chosen} bytes, the largest read within {lead:.2f}x of the "
        f"fastest ({rates} GB/s; the setting's {piece} bytes)"
    )


def _sweep_words(sweeps: int, *, by_kernels: bool) -> str:
    """What a probe does with each piece, in the words of the records."""
    swept = "the pass's kernels" if by_kernels else "a sum of the bytes"
    if sweeps == 2:
        return f"read, digest and a sweep by {swept}"
    return f"read and one sweep by {swept} (the digest in the kernel's)"


def _decide(rate: dict[str, float], sweeps: int) -> tuple[str, str]:
    """The way a probe's rates choose, and the rule that chose it.

    Within ``1 / MARGIN`` of each other the rates do not tell the ways apart
    (rounds of one file differ by 5-10 %), and a tie goes to the way every pass
    measured so far found faster: where the kernels carry the digest (one
    sweep) the map, which won each such pass measured, 1.35-1.63x on the Intel
    VM (issue 24, tenth stop) and 1.13-1.48x on the AVX2 VM whose probes
    measured the two within 1.15x at the pass's piece alignment (thirteenth
    stop); where the digest is a sweep of its own, ``pread`` (the copy leaves
    the piece in cache for both sweeps; "Mapped reads").  A clear difference
    either way decides: a file not in the page cache or on a network file
    system, where faults cost more.
    """
    lead = 1 / MARGIN
    if sweeps == 1:
        if rate["mmap"] <= MARGIN * rate["pread"]:
            return "pread", f"pread at least {lead:.2f}x faster than the map"
        return "mmap", f"the map unless pread is at least {lead:.2f}x faster"
    if rate["pread"] <= MARGIN * rate["mmap"]:
        return "mmap", f"the map at least {lead:.2f}x faster than pread"
    return "pread", f"pread unless the map is at least {lead:.2f}x faster"


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
    digest_sweep: bool = True,
    map_piece: int = 0,
    kernels: Sweep | None = None,
    piece_cap: int = 0,
) -> ReadChoice:
    """How to read a chunk's pieces, and in what size where ``pread`` reads them.

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
    digest_sweep
        Whether the pass hashes each piece in a sweep of its own before its kernels
        (else the kernels carry the digest in their sweep): the probe sweeps the same.
    map_piece
        Bytes per piece the pass maps at a time, where larger than ``piece``
        (``map_piece_mib``): the probe maps pieces of that size too.
    kernels
        Sweeps a piece (its bytes) with the pass's own kernels, results dropped
        (a runtime stream's ``sweep``), where the runtime offers it; else the probe
        sums each piece's bytes.  A kernel slower than memory hides what a map's
        reads cost beyond ``pread``'s and leaves the copy as ``pread``'s extra work:
        on the AVX2 VM of issue 24's thirteenth stop the sum chose ``pread`` for a
        ``.npy`` whose pass ran 1.15x faster through the map.  The first pass that
        probes a file decides for it in this process.
    piece_cap
        The most bytes one piece of the pass may hold (what admission counted for a
        task: the larger of the read and mapped pieces).  Where it is at least twice
        ``piece``, the probe also reads ``pread`` pieces of up to :data:`PREAD_LARGER`
        times ``piece`` and the choice says which size ``pread`` reads in
        (:attr:`ReadChoice.piece_bytes`).
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
    sweeps = 2 if digest_sweep else 1
    key = (
        str(path),
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
        piece,
        sweeps,
        map_piece,
        kernels is not None,
        piece_cap,
    )
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
        # every probe now, back to back, while this worker's other tasks reading the file wait
        # on the lock: a probe made later, on another chunk, ran beside the first chunk's
        # kernels (benchmarks/RESULTS.md, issue 24, thirteenth stop)
        tries = _BUSY_TRIES.get(key, 0)
        kernels, fell_back = _working_sweep(kernels, piece)
        probes: list[ReadChoice] = []
        for i in range(PROBES):
            # each probe reads other pieces than the earlier ones (not the pages they left cached)
            probe = _probe(
                path,
                offset,
                nbytes,
                piece,
                i * nbytes // PROBES,
                sweeps,
                map_piece,
                count_busy=tries >= BUSY_TRIES,
                kernels=kernels,
                piece_cap=piece_cap,
            )
            if not probe.measured_GBps:  # too short, or other work: decides nothing now
                if probe.why.startswith(_BUSY):
                    _BUSY_TRIES[key] = tries + 1
                return probe
            probes.append(probe)
        _BUSY_TRIES.pop(key, None)
        decided = _verdict(probes, sweeps, by_kernels=kernels is not None, piece=piece)
        if fell_back:
            decided = dataclasses.replace(decided, why=f"{fell_back}; {decided.why}")
        _PROBES[key] = decided
        return decided


def _working_sweep(kernels: Sweep | None, piece: int) -> tuple[Sweep | None, str]:
    """The pass's kernels where they sweep a piece of zeros, else ``None`` and why not.

    A runtime's ``sweep`` that fails (the conformance suite checks it; a third party's
    may still) must not fail the chunk it was to measure for: the probe sums the bytes
    instead, and the record says so.
    """
    if kernels is None:
        return None, ""
    try:
        kernels(np.zeros(piece, dtype=np.uint8))
    except Exception as exc:  # whatever the runtime raised: the probe goes on without it
        return None, (
            f"the pass's kernels could not sweep a probe's piece ({type(exc).__name__}: "
            f"{exc}), so the probe swept a sum of the bytes"
        )
    return kernels, ""


def _verdict(
    probes: list[ReadChoice], sweeps: int, *, by_kernels: bool, piece: int = 0
) -> ReadChoice:
    """The file's read method from its probes: the fastest round each way over all of them.

    Other work (the other task threads' kernels, a compiler) only ever slows a
    round down, and it hits one way in one probe as often as the other: the
    fastest round of each way over every probe is the nearest to each way's
    own rate.  Which way wins within ``1 / MARGIN``: :func:`_decide`; which
    ``pread`` piece, where the probes read more than one: :func:`_pread_piece`.
    """
    best = {k: max(p.measured_GBps[k] for p in probes) for k in probes[0].measured_GBps}
    sizes = {size: max(p.pread_GBps[size] for p in probes) for size in probes[0].pread_GBps}
    if sizes:
        best["pread"] = max(sizes.values())
    method, rule = _decide(best, sweeps)
    chosen, size_rule = _pread_piece(sizes, piece)
    what = _sweep_words(sweeps, by_kernels=by_kernels)
    return ReadChoice(
        method,
        (
            f"{len(probes)} probes on this file by this worker, back to back on different "
            "pieces: "
            f"{', then '.join(str(p.measured_GBps) for p in probes)} GB/s ({what} on every CPU "
            f"thread at once); their fastest rounds, a map {best['mmap']:.1f} GB/s and pread "
            f"{best['pread']:.1f} GB/s ({rule}): "
            f"{'the map' if method == 'mmap' else 'pread'} for every chunk of this file"
            + (f"; {size_rule}" if sizes and method == "pread" else "")
        ),
        {k: round(v, 3) for k, v in best.items()},
        piece_bytes=chosen if method == "pread" and chosen != piece else 0,
        pread_GBps=sizes,
    )
