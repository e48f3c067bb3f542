"""Work shared between the tasks of one pass that run in the same process.

A pass over unpersisted data runs as a few tasks of whole chunks
(:mod:`.pass_groups`).  The threads running them finish at different
times: the same bytes take one thread a few milliseconds longer than the
other on a shared machine, and a thread whose task is done waits idle for
the last one (a 2 GiB pass on the embedded default: its two threads
finished 3-14 ms apart, benchmarks/RESULTS.md, issue 24).  Dask cannot
help there: a chunk takes 17 ms, so no task is left to move.

So the tasks of one pass in one process share their work.  A task first
runs its own chunks, taken from the front of its queue; then, instead of
ending, it helps: it takes whole chunks from the back of another task's
queue (their partials go back to the task they belong to, which waits for
them once it has nothing left to help with: every task returns exactly its
own chunks, so a task Dask runs again after losing its worker counts none
twice), and when no queue holds any, it takes
the tail of a chunk another thread is streaming: the last half of the
scan rows that thread has not started (:meth:`PassWork.take_rows`).
The owner stops its stream where the taken rows begin
(:meth:`~quantem_flow.runtimes.base.FramePassStream.stop_early`), waits
for the taken rows' results and joins them to its own, so each chunk
still has one record, one digest and one block.

Only passes whose results cannot depend on where a split falls share work
(:func:`why_not_shared`): per-frame values do not, maxima do not, integer
sums (widened to 64 bits) do not; sums of real-valued frames would, by
rounding, so such passes do not share.  Whether a pass shared is in its
provenance (``execution["work_sharing"]``), and each chunk's record says
which rows another thread ran (``streamed["shared"]``) and whether the
chunk was taken from another task's queue (``taken_from_queue``).

No thread waits for work that is not running: rows are taken only from a
stream that is running and only by a thread with nothing of its own left,
which runs them at once; every taken part is marked done (with its
result or its error) whatever happens, and the owner raises the taker's
error as its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ChunkQueue",
    "Handoff",
    "LentChunk",
    "PassWork",
    "SharedRows",
    "pass_work",
    "why_not_shared",
]

#: One chunk of a task: ``(chunk index, first scan row, stop scan row)``.
ChunkRun = tuple[int, int, int]


def why_not_shared(dtype: Any, *, want_sum: bool, representation: str) -> str | None:
    """Why a pass's tasks may not share their work, or ``None`` when they may.

    Parameters
    ----------
    dtype
        The frames' dtype.
    want_sum
        Whether the pass sums patterns.
    representation
        The dataset's representation (only dense frames are streamed in rows).
    """
    if representation != "dense":
        return f"{representation} chunks are not streamed in scan rows"
    if want_sum and np.dtype(dtype).kind in "fc":
        return (
            "the pass sums real-valued patterns: where a chunk splits would change the "
            "rounding of the sum, so each task runs its own chunks"
        )
    return None


class Handoff:
    """Work one thread runs for another, which waits for its result (or raises its error)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def deliver(self, result: Any) -> None:
        """The work ran: ``result`` goes to the thread waiting for it."""
        self._result = result
        self._done.set()

    def fail(self, error: BaseException) -> None:
        """The work failed: the waiting thread raises ``error``."""
        self._error = error
        self._done.set()

    def run(self, work: Callable[[], Any]) -> None:
        """Run ``work`` here and deliver its result, or fail with its error: never neither.

        An error that is not an :class:`Exception` (an interrupt) is raised here too.
        """
        try:
            self.deliver(work())
        except BaseException as exc:
            self.fail(exc)
            if not isinstance(exc, Exception):
                raise

    def wait(self) -> Any:
        """The result once the work ran (raises its error)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class SharedRows(Handoff):
    """A run of scan rows ``[start, stop)`` one thread streams, whose tail others may take.

    The owner calls :meth:`begin` before each piece and :meth:`close` after
    the last; a thread that took rows (:meth:`PassWork.take_rows`) delivers
    them with :meth:`deliver` or :meth:`fail`.  ``stop`` only falls, under
    the pass's lock.
    """

    def __init__(
        self, work: PassWork, start: int, stop: int, *, row_bytes: int, piece_bytes: int
    ) -> None:
        super().__init__()
        self._work = work
        self.start = int(start)
        self.stop = int(stop)
        self.row_bytes = int(row_bytes)
        self.piece_bytes = max(1, int(piece_bytes))
        #: first row the owner has not started
        self.next_row = int(start)
        #: parts other threads took, in the order taken (each ends where the previous began)
        self.parts: list[SharedRows] = []
        self.splittable = False
        self.ran_by = ""

    def open(self, *, splittable: bool) -> None:
        """The owner starts: others may take rows from now on where ``splittable``."""
        with self._work.lock:
            self.splittable = bool(splittable)
            self.ran_by = threading.current_thread().name

    def begin(self, rows: tuple[int, int]) -> int | None:
        """The owner starts a piece of scan rows ``rows``: where it ends, or ``None``.

        ``None``: the rows were taken, the owner's stream ends here.  Else the
        piece's stop row, earlier than ``rows[1]`` where rows were taken from
        inside it.
        """
        with self._work.lock:
            if rows[0] >= self.stop:
                return None
            end = min(int(rows[1]), self.stop)
            self.next_row = max(self.next_row, end)
            return end

    def close(self) -> None:
        """The owner ran its last piece: nothing more may be taken."""
        with self._work.lock:
            self.splittable = False
            self._work.forget(self)


class LentChunk(Handoff):
    """A chunk of one task's queue that another thread runs; its partial goes back to the task.

    So every task still returns exactly the chunks it was given (a task Dask runs again
    after losing its worker returns them again, and no chunk counts twice).
    """

    def __init__(self, chunk: ChunkRun) -> None:
        super().__init__()
        self.chunk = chunk


class ChunkQueue:
    """A task's chunks: it takes them from the front, helpers from the back (lent to them)."""

    def __init__(self, work: PassWork, chunks: Sequence[ChunkRun]) -> None:
        self._work = work
        self._chunks: deque[ChunkRun] = deque((int(i), int(r0), int(r1)) for i, r0, r1 in chunks)
        #: chunks other threads took from the back, in the order taken
        self.lent: list[LentChunk] = []

    def __len__(self) -> int:
        return len(self._chunks)

    def __iter__(self) -> Iterator[ChunkRun]:
        while True:
            with self._work.lock:
                if not self._chunks:
                    return
                nxt = self._chunks.popleft()
            yield nxt

    def _lend_last(self) -> LentChunk | None:
        if not self._chunks:
            return None
        lent = LentChunk(self._chunks.pop())
        self.lent.append(lent)
        return lent


class PassWork:
    """The shared work of one pass in this process (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._queues: list[ChunkQueue] = []
        self._running: list[SharedRows] = []
        self.users = 0

    def queue(self, chunks: Sequence[ChunkRun]) -> ChunkQueue:
        """A task's chunks, where helpers can see them."""
        q = ChunkQueue(self, chunks)
        with self.lock:
            self._queues.append(q)
        return q

    def running(self, start: int, stop: int, *, row_bytes: int, piece_bytes: int) -> SharedRows:
        """A stream of scan rows ``[start, stop)`` starting on this thread."""
        rows = SharedRows(self, start, stop, row_bytes=row_bytes, piece_bytes=piece_bytes)
        with self.lock:
            self._running.append(rows)
        return rows

    def forget(self, rows: SharedRows) -> None:
        """(Under the lock.) A closed stream leaves the running list."""
        with contextlib.suppress(ValueError):
            self._running.remove(rows)

    def take_chunk(self) -> LentChunk | None:
        """The last chunk of the queue with the most chunks, or ``None`` when none are queued.

        The caller must run it and :meth:`~LentChunk.deliver` or :meth:`~LentChunk.fail` it:
        the task whose queue it was waits for it.
        """
        with self.lock:
            fullest = max(self._queues, key=len, default=None)
            return None if fullest is None else fullest._lend_last()

    def take_rows(self) -> SharedRows | None:
        """The later half of the rows not yet started by the stream with the most left.

        A stream gives rows only while at least two of its pieces are left and
        the taker gets at least one.  The taken part is registered as a
        stream of its own (not splittable until its taker :meth:`SharedRows.open`-s
        it); the caller must run it and :meth:`~SharedRows.deliver` or
        :meth:`~SharedRows.fail` it.
        """
        with self.lock:
            best: SharedRows | None = None
            best_left = 0
            for r in self._running:
                if not r.splittable:
                    continue
                left = r.stop - r.next_row
                if left >= 2 and left * r.row_bytes >= 2 * r.piece_bytes and left > best_left:
                    best, best_left = r, left
            if best is None:
                return None
            # about half, on the owner's grid of pieces (counted from its start), so the owner
            # runs no cut piece; the taker gets at least one piece, the owner may keep none
            per_piece = max(1, best.piece_bytes // max(1, best.row_bytes))
            half = best.next_row + best_left // 2 - best.start
            split = best.start + round(half / per_piece) * per_piece
            split = max(best.next_row, min(split, best.stop - per_piece))
            part = SharedRows(
                self, split, best.stop, row_bytes=best.row_bytes, piece_bytes=best.piece_bytes
            )
            best.stop = split
            best.parts.append(part)
            self._running.append(part)
            return part


_POOLS: dict[str, PassWork] = {}
_POOLS_LOCK = threading.Lock()


@contextlib.contextmanager
def pass_work(pass_name: str) -> Iterator[PassWork]:
    """The shared work of pass ``pass_name`` in this process, while a task of it runs."""
    with _POOLS_LOCK:
        work = _POOLS.get(pass_name)
        if work is None:
            work = _POOLS[pass_name] = PassWork()
        work.users += 1
    try:
        yield work
    finally:
        with _POOLS_LOCK:
            work.users -= 1
            if work.users == 0 and _POOLS.get(pass_name) is work:
                del _POOLS[pass_name]


def active_passes() -> list[str]:
    """Names of the passes with tasks sharing work in this process now (for tests)."""
    with _POOLS_LOCK:
        return sorted(_POOLS)
