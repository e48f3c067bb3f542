"""The reference ``qf-worker/1`` worker: every message, on the host, with NumPy.

It is the executable form of ``docs/protocol.md`` and the test double that
lets the bridge, the conformance suite and cluster tests run without Node or
a browser.  Run it over pipes::

    python -m quantem_flow.runtimes.external.reference_worker --budget-bytes 1000000000

or drive :class:`ReferenceWorker` directly (``handle(message) -> reply``),
or over any :class:`~.transport.Connection` with :func:`serve_connection`
(the WebSocket tests do that).

Kernels are plain NumPy, written for clarity over speed:

* ``frame_pass``: ``per_frame = frames @ weights.T`` in float64 (exact for
  integer data and integer weights while sums stay below 2**53),
  ``pattern_sum`` int64 for integer data (float64 otherwise),
  ``pattern_max`` in the data's dtype; paired data scatter their events
  (O(events)), packed data are decoded a few frames at a time.
* ``gather``: the values of the asked flat pixels, ``(n_frames, n)``.

Test hooks (never needed in use): ``--run-delay S`` sleeps before answering
each ``run``; ``--crash-file PATH`` makes the worker kill itself (SIGKILL)
when a ``run`` arrives while ``PATH`` exists (the file is removed first), so
a test can crash it "mid-pass" from any process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import signal
import sys
import time
from typing import Any, Protocol

import numpy as np

from ...errors import ProtocolError
from ..nonfinite import repair_per_frame
from . import protocol as pr
from .protocol.messages import _pattern_sum_dtype as pattern_sum_dtype

__all__ = ["ReferenceWorker", "main", "serve_connection", "serve_pipes", "serve_websocket"]

_VERSION = "0.1.0"
_INTEGER_DTYPES = tuple(d for d in pr.DTYPES if np.dtype(d).kind in "ui")
#: Frames decoded at a time from a packed payload.
_PACKED_GROUP = 16


@dataclasses.dataclass
class _Stored:
    representation: str
    payload: Any
    dtype: np.dtype[Any]
    shape: tuple[int, int, int, int]
    nbytes: int


class _ReplyError(Exception):
    """An error reply (code, message, handle) raised inside a handler."""

    def __init__(self, code: str, message: str, handle: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.handle = handle


class ReferenceWorker:
    """The protocol state machine of a worker: one request in, one reply out.

    Parameters
    ----------
    budget_bytes
        Payload bytes (chunks and weights) admitted in total.
    runtime
        The runtime name announced in ``hello``.
    max_message_bytes
        Largest frame accepted (announced in ``hello``).
    run_delay
        Seconds slept before answering each ``run`` (tests).
    crash_file
        If this file exists when a ``run`` arrives, remove it and SIGKILL
        this process (tests).
    """

    def __init__(
        self,
        *,
        budget_bytes: int = 1 << 30,
        runtime: str = "external-reference",
        max_message_bytes: int = 1 << 30,
        run_delay: float = 0.0,
        crash_file: str | None = None,
    ) -> None:
        self.budget_bytes = int(budget_bytes)
        self.runtime = runtime
        self.max_message_bytes = int(max_message_bytes)
        self.run_delay = float(run_delay)
        self.crash_file = crash_file
        self.chunks: dict[int, _Stored] = {}
        self.weights: dict[int, tuple[np.ndarray, bool]] = {}
        self.greeted = False
        self.closing = False

    # ---------------------------------------------------------------- accounting
    def resident_bytes(self) -> dict[str, int]:
        """Bytes held per representation and for weights."""
        out = {"dense": 0, "paired": 0, "packed": 0, "weights": 0}
        for s in self.chunks.values():
            out[s.representation] += s.nbytes
        out["weights"] = sum(int(w.nbytes) for w, _ in self.weights.values())
        return out

    def total_bytes(self) -> int:
        """Bytes held in total."""
        return sum(self.resident_bytes().values())

    def _admit(self, nbytes: int, handle: int, what: str) -> None:
        free = self.budget_bytes - self.total_bytes()
        if nbytes > free:
            raise _ReplyError(
                "budget",
                f"{what} of {nbytes} bytes does not fit: {free} of {self.budget_bytes} budget "
                f"bytes are free; release handles or give the worker a larger --budget-bytes "
                "(nothing was allocated)",
                handle,
            )

    def _new_handle(self, handle: int, kind: str) -> None:
        if handle in self.chunks or handle in self.weights:
            raise _ReplyError(
                "bad_request",
                f"{kind}: handle {handle} is already in use; handles are new for every put "
                "(release it first)",
                handle,
            )

    # ---------------------------------------------------------------- messages
    def hello(self) -> pr.Message:
        """The ``hello`` reply of this worker (id filled in by :meth:`handle`)."""
        kernels = []
        for op in ("frame_pass", "gather"):
            for dt in pr.DTYPES:
                kernels.append([op, "dense", dt])
            for rep in ("paired", "packed"):
                for dt in _INTEGER_DTYPES:
                    kernels.append([op, rep, dt])
        return pr.hello_reply(
            id=0,
            runtime=self.runtime,
            implementation=(
                f"quantem-flow reference worker {_VERSION} (python "
                f"{sys.version.split()[0]}, numpy {np.__version__})"
            ),
            device={"name": "host CPU (NumPy)", "type": "cpu", "backend": "numpy"},
            limits={
                "max_message_bytes": self.max_message_bytes,
                "max_buffer_bytes": self.max_message_bytes,
                "max_weights": 4096,
                "max_frame_pixels": 1 << 26,
            },
            memory_budget_bytes=self.budget_bytes,
            kernels=kernels,
            storage_schemas=list(pr.STORAGE_SCHEMAS.values()),
            accumulation={"integer": "int64", "real": "float64"},
        )

    def handle(self, message: pr.Message) -> pr.Message:
        """Answer one request (never raises for a bad request: it answers ``error``).

        After a ``bye`` reply or a ``version`` error, :attr:`closing` is true.
        """
        rid = message.id
        try:
            request = pr.parse_request(message)
            if isinstance(request, pr.Hello):
                if request.protocol != pr.PROTOCOL:
                    self.closing = True
                    raise _ReplyError(
                        "version",
                        f"this worker speaks {pr.PROTOCOL!r} only, the bridge asked for "
                        f"{request.protocol!r}; update one side",
                    )
                self.greeted = True
                reply = self.hello()
                reply.header["id"] = rid
                return reply
            if not self.greeted:
                raise _ReplyError("bad_request", f"{message.type} before hello: send hello first")
            return self._answer(request).message()
        except _ReplyError as exc:
            return pr.error(id=rid, code=exc.code, message=exc.message, handle=exc.handle)
        except ProtocolError as exc:
            return pr.error(
                id=rid, code=exc.code or "bad_request", message=str(exc), handle=exc.handle
            )
        except MemoryError as exc:
            return pr.error(id=rid, code="device", message=f"out of host memory: {exc}")
        except Exception as exc:  # the worker stays usable
            return pr.error(id=rid, code="internal", message=f"{type(exc).__name__}: {exc}")

    def _answer(self, request: pr.Request) -> _Reply:
        """The typed reply to a typed request (after ``hello``)."""
        if isinstance(request, pr.Put):
            return self._on_put(request)
        if isinstance(request, pr.PutWeights):
            return self._on_put_weights(request)
        if isinstance(request, (pr.RunFramePass, pr.RunGather)):
            return self._on_run(request)
        if isinstance(request, pr.Release):
            return self._on_release(request)
        if isinstance(request, pr.Stats):
            return pr.StatsReply(
                request.id,
                len(self.chunks) + len(self.weights),
                self.resident_bytes(),
                self.budget_bytes,
            )
        if isinstance(request, pr.Bye):
            self.chunks.clear()
            self.weights.clear()
            self.closing = True
        return request  # ping and bye: answered by the same message

    def _on_put(self, request: pr.Put) -> pr.PutResult:
        handle = request.handle
        self._new_handle(handle, "put")
        nbytes = request.nbytes
        # sizes were checked by the parser (bad_request); then the budget: nothing is kept
        self._admit(nbytes, handle, f"put of a {request.representation} chunk")
        owned = _own(request.representation, request.payload)
        rows, cols, kr, kc = request.shape
        self.chunks[handle] = _Stored(
            representation=request.representation,
            payload=owned,
            dtype=np.dtype(request.dtype),
            shape=(rows, cols, kr, kc),
            nbytes=nbytes,
        )
        return pr.PutResult(request.id, handle, nbytes)

    def _on_put_weights(self, request: pr.PutWeights) -> pr.PutWeightsResult:
        handle = request.handle
        self._new_handle(handle, "put_weights")
        self._admit(int(request.weights.nbytes), handle, "put_weights")
        w = np.array(request.weights, dtype=np.float64, copy=True)
        integer = bool(np.all(np.isfinite(w)) and np.all(w == np.round(w)))
        self.weights[handle] = (w, integer)
        return pr.PutWeightsResult(request.id, handle, int(w.nbytes), integer)

    def _chunk(self, handle: int) -> _Stored:
        stored = self.chunks.get(handle)
        if stored is None:
            raise _ReplyError(
                "unknown_handle",
                f"no chunk under handle {handle} (held: {sorted(self.chunks)}); put the chunk "
                "first, or re-place it if this worker restarted",
                handle,
            )
        return stored

    def _on_run(self, request: pr.RunFramePass | pr.RunGather) -> _Reply:
        if self.crash_file is not None and os.path.exists(self.crash_file):
            os.remove(self.crash_file)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.run_delay:
            time.sleep(self.run_delay)
        stored = self._chunk(request.chunk)
        rows, cols, kr, kc = stored.shape
        n, k = rows * cols, kr * kc
        if isinstance(request, pr.RunGather):
            idx = request.indices
            if idx.size and int(idx.max()) >= k:
                raise _ReplyError(
                    "bad_request",
                    f"gather: pixel index {int(idx.max())} is outside the frame of {k} pixels",
                    request.chunk,
                )
            values = np.empty((n, idx.size), dtype=stored.dtype)
            for f0, frames in _frames(stored):
                values[f0 : f0 + frames.shape[0]] = frames[:, idx]
            return pr.GatherResult(request.id, values)
        wh = request.weights
        entry = self.weights.get(wh)
        if entry is None:
            raise _ReplyError(
                "unknown_handle",
                f"no weights under handle {wh} (held: {sorted(self.weights)}); put_weights first",
                wh,
            )
        w, _ = entry
        if w.shape[1] != k:
            raise _ReplyError(
                "bad_request",
                f"run: weights {wh} have {w.shape[1]} columns but chunk {request.chunk} has "
                f"frames of {k} pixels",
                wh,
            )
        per_frame, psum, pmax = _frame_pass(stored, w, request.want_sum, request.want_max)
        acc = "int64" if stored.dtype.kind in "ui" else "float64"
        return _FramePassReply(request.id, per_frame, psum, pmax, acc)

    def _on_release(self, request: pr.Release) -> pr.ReleaseResult:
        freed = []
        for handle in request.handles:
            if (
                self.chunks.pop(handle, None) is not None
                or self.weights.pop(handle, None) is not None
            ):
                freed.append(handle)
        return pr.ReleaseResult(request.id, tuple(freed), self.total_bytes())


class _Reply(Protocol):
    """A typed reply (or a ping/bye request answered as it is): it makes its message."""

    def message(self) -> pr.Message: ...


@dataclasses.dataclass(frozen=True, eq=False)
class _FramePassReply:
    """A frame-pass reply to send (the bridge reads it as a ``FramePassOutputs``)."""

    id: int
    per_frame: np.ndarray
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None
    accumulation: str

    def message(self) -> pr.Message:
        return pr.frame_pass_result(
            id=self.id,
            per_frame=self.per_frame,
            pattern_sum=self.pattern_sum,
            pattern_max=self.pattern_max,
            accumulation=self.accumulation,
        )


def _own(rep: str, payload: Any) -> Any:
    """The payload to keep: views into the frame it arrived in, without a copy.

    Each decoded frame has an allocation of its own, so the views pin exactly
    the payload's bytes (plus the header and padding), nothing else.
    """
    return payload


def _frames(stored: _Stored) -> Any:
    """Yield ``(first frame, (g, K) frames)`` groups of a stored chunk in its dtype."""
    rows, cols, kr, kc = stored.shape
    n, k = rows * cols, kr * kc
    p = stored.payload
    if stored.representation == "dense":
        yield 0, p.reshape(n, k)
    elif stored.representation == "paired":
        indptr = np.asarray(p.indptr)
        for f0 in range(0, n, _PACKED_GROUP):
            f1 = min(n, f0 + _PACKED_GROUP)
            out = np.zeros((f1 - f0, k), dtype=stored.dtype)
            a, b = int(indptr[f0]), int(indptr[f1])
            frame = np.repeat(np.arange(f1 - f0), np.diff(indptr[f0 : f1 + 1]))
            out[frame, p.indices[a:b].astype(np.int64)] = p.counts[a:b]
            yield f0, out
    else:
        from ...representations.packed import unpack_frames

        for f0 in range(0, n, _PACKED_GROUP):
            f1 = min(n, f0 + _PACKED_GROUP)
            out = np.empty((f1 - f0, k), dtype=stored.dtype)
            unpack_frames(p.data, p.widths, p.offsets, p.block_values, f0, f1, out)
            yield f0, out


def _least(dtype: np.dtype[Any]) -> Any:
    return np.iinfo(dtype).min if dtype.kind in "ui" else -np.inf


def _frame_pass(
    stored: _Stored, w: np.ndarray, want_sum: bool, want_max: bool
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    rows, cols, kr, kc = stored.shape
    n, k = rows * cols, kr * kc
    per_frame = np.zeros((n, w.shape[0]), dtype=np.float64)
    psum = np.zeros(k, dtype=pattern_sum_dtype(stored.dtype)) if want_sum else None
    pmax: np.ndarray | None = None
    if want_max and n == 0:  # the maximum of nothing: the dtype's least value
        pmax = np.full(k, _least(stored.dtype), dtype=stored.dtype)
    if stored.representation == "paired":
        p = stored.payload
        frame = np.repeat(np.arange(n), np.diff(np.asarray(p.indptr)))
        idx = p.indices.astype(np.int64)
        counts = p.counts.astype(np.float64)
        for j in range(w.shape[0]):
            per_frame[:, j] = np.bincount(frame, weights=counts * w[j, idx], minlength=n)
        if psum is not None:
            np.add.at(psum, idx, p.counts.astype(psum.dtype))
        if want_max and n:
            pmax = np.zeros(k, dtype=stored.dtype)
            np.maximum.at(pmax, idx, p.counts.astype(stored.dtype))
        return per_frame, psum, pmax
    for f0, frames in _frames(stored):
        with np.errstate(invalid="ignore", over="ignore"):
            block = frames.astype(np.float64) @ w.T
        if frames.dtype.kind == "f" and w.shape[0]:  # skip zero weights where 0 * NaN struck
            repair_per_frame(block, w, functools.partial(np.take, frames, axis=0))
        per_frame[f0 : f0 + frames.shape[0]] = block
        if psum is not None:
            psum += frames.sum(axis=0, dtype=psum.dtype)
        if want_max and frames.shape[0]:
            m = frames.max(axis=0)
            pmax = m if pmax is None else np.maximum(pmax, m)
    return per_frame, psum, pmax


# ============================================================================ serving


def serve_connection(
    connection: Any, worker: ReferenceWorker, *, idle_timeout: float = 3600.0
) -> None:
    """Answer requests arriving on ``connection`` until ``bye``, a close or a bad frame.

    Parameters
    ----------
    connection
        Anything with ``recv(timeout) -> Message`` and ``send(message)``
        (a bridge-side transport connection used the other way round, as
        the WebSocket tests do).
    worker
        The state machine.
    idle_timeout
        Stop after this many seconds without a request.
    """
    from ...errors import ExternalWorkerError

    while not worker.closing:
        try:
            message = connection.recv(idle_timeout)
        except ProtocolError as exc:
            connection.send(pr.error(id=None, code=exc.code or "frame", message=str(exc)))
            return
        except ExternalWorkerError:
            return
        connection.send(worker.handle(message))


async def serve_websocket(
    url: str, worker: ReferenceWorker, *, idle_timeout: float = 3600.0
) -> int | None:
    """Connect to a bridge's WebSocket ``url`` (with its token) and serve ``worker`` there.

    What a browser page does, in Python: the tests use it as the page.

    Returns
    -------
    int or None
        The close code of the socket (``None`` if it was closed by ``bye``).

    Raises
    ------
    tornado.httpclient.HTTPClientError
        The bridge refused the connection (403 for a wrong or used token).
    """
    import asyncio

    import tornado.websocket

    ws = await tornado.websocket.websocket_connect(url, max_message_size=worker.max_message_bytes)
    try:
        while not worker.closing:
            data = await asyncio.wait_for(ws.read_message(), timeout=idle_timeout)
            if data is None:
                return int(ws.close_code) if ws.close_code is not None else 1006
            if isinstance(data, str):
                data = data.encode()
            try:
                message = pr.decode(data, max_message_bytes=worker.max_message_bytes)
            except ProtocolError as exc:
                await ws.write_message(
                    pr.encode(pr.error(id=None, code=exc.code or "frame", message=str(exc))),
                    binary=True,
                )
                return 1002
            await ws.write_message(pr.encode(worker.handle(message)), binary=True)
        return None
    finally:
        ws.close()


def serve_pipes(worker: ReferenceWorker, *, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Serve ``worker`` on file descriptors (stdin and stdout); return the exit status.

    Anything else this process would print goes to stderr (stdout carries
    frames only).  EOF on stdin means ``bye`` (status 0); a frame that
    cannot be parsed is answered with an unsolicited ``error`` and ends the
    process (status 2); a ``version`` error ends it with status 3.
    """
    out = os.fdopen(os.dup(stdout_fd), "wb", buffering=0)
    os.dup2(2, stdout_fd)  # stray prints go to stderr, never into the frame stream
    sys.stdout = sys.stderr

    def send(message: pr.Message) -> None:
        for piece in pr.encode_pieces(message):
            out.write(piece)

    decoder = pr.FrameDecoder(max_message_bytes=worker.max_message_bytes)
    try:
        while True:
            data = os.read(stdin_fd, 1 << 20)
            if not data:
                decoder.close()
                return 0
            for message in decoder.feed(data):
                reply = worker.handle(message)
                send(reply)
                if worker.closing:
                    return 0 if reply.type == "bye" else 3
    except ProtocolError as exc:
        print(f"qf reference worker: {exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            send(pr.error(id=None, code=exc.code or "frame", message=str(exc)))
        return 2
    except BrokenPipeError:
        return 0


def main(argv: list[str] | None = None) -> int:
    """Command line of the reference worker (stdin/stdout pipes)."""
    parser = argparse.ArgumentParser(
        prog="python -m quantem_flow.runtimes.external.reference_worker",
        description="The reference qf-worker/1 worker (NumPy on the host) over stdin/stdout.",
    )
    parser.add_argument("--budget-bytes", type=int, default=1 << 30, help="payload bytes admitted")
    parser.add_argument("--runtime", default="external-reference", help="runtime name in hello")
    parser.add_argument("--max-message-bytes", type=int, default=1 << 30)
    parser.add_argument("--run-delay", type=float, default=0.0, help="(tests) sleep before runs")
    parser.add_argument("--crash-file", default=None, help="(tests) SIGKILL self if it exists")
    args = parser.parse_args(argv)
    worker = ReferenceWorker(
        budget_bytes=args.budget_bytes,
        runtime=args.runtime,
        max_message_bytes=args.max_message_bytes,
        run_delay=args.run_delay,
        crash_file=args.crash_file,
    )
    print(f"qf reference worker {_VERSION} ready (pid {os.getpid()})", file=sys.stderr)
    return serve_pipes(worker)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
