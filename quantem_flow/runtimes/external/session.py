"""One bridge-side session with an external worker: handshake, requests, restarts.

:class:`ExternalSession` owns a connection (made by a ``connect`` callable:
a child process over pipes, a browser page over a WebSocket), says
``hello``, checks the protocol version and then sends one request at a time
(under a lock), each with a fresh id, and waits for the reply with that id.
Error replies become the project's errors, naming the worker, the request
type, the handle and the code.

When the worker dies mid-request (a crash, a kill, a closed page) the
request raises :class:`~quantem_flow.errors.ExternalWorkerLostError` and
the connection is dropped; the next request starts a new one (a new
``hello``) and increments :attr:`ExternalSession.generation`.  Handles are
only meaningful within the generation that made them: callers keep the
generation beside each handle and treat older ones as stale.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ...errors import (
    ExternalWorkerError,
    ExternalWorkerLostError,
    ExternalWorkerTimeoutError,
    ProtocolError,
)
from . import protocol as pr
from .transport import Connection

__all__ = ["REPLY_TYPES", "ExternalSession", "error_from_reply"]

logger = logging.getLogger(__name__)

#: Error codes that are protocol violations (raised as ProtocolError).
_PROTOCOL_CODES = ("version", "frame", "truncated", "too_large", "bad_request")
#: Error codes after which the worker closes the connection.
_FATAL_CODES = ("version", "frame", "truncated", "too_large")

#: The reply type of every request (docs/protocol.md, "Messages"); an ``error`` may
#: answer any of them.
REPLY_TYPES = {
    "hello": "hello",
    "put": "result",
    "put_weights": "result",
    "run": "result",
    "release": "result",
    "stats": "stats",
    "ping": "ping",
    "bye": "bye",
}


def _client_name() -> str:
    try:
        from importlib.metadata import version

        return f"quantem-flow {version('quantem-flow')}"
    except Exception:  # pragma: no cover - not installed as a distribution
        return "quantem-flow"


def error_from_reply(
    reply: pr.Message, *, worker: str, message_type: str, handle: int | None = None
) -> Exception:
    """Return the project error for an ``error`` reply.

    ``version``, ``frame``, ``truncated``, ``too_large`` and ``bad_request``
    give :class:`~quantem_flow.errors.ProtocolError`; every other code an
    :class:`~quantem_flow.errors.ExternalWorkerError`.  Both carry ``code``,
    ``worker``, ``message_type`` and ``handle``.
    """
    h = reply.header
    code = str(h.get("code"))
    got = h.get("handle")
    if isinstance(got, int) and not isinstance(got, bool):
        handle = got
    text = (
        f"external worker {worker!r} refused {message_type}"
        + (f" on handle {handle}" if handle is not None else "")
        + f" with {code!r}: {h.get('message', '(no message)')}"
    )
    if code in _PROTOCOL_CODES:
        return ProtocolError(
            text, code=code, worker=worker, message_type=message_type, handle=handle
        )
    return ExternalWorkerError(
        text, code=code, worker=worker, message_type=message_type, handle=handle
    )


class ExternalSession:
    """Requests and replies with one external worker, restarting it after a loss.

    Parameters
    ----------
    connect
        Makes a new connection (starts the process, or waits for the page).
    name
        Worker name used in errors.
    timeout
        Seconds a reply may take beyond the time its bytes need (default
        ``qf.config`` ``external_timeout_s``); see :meth:`deadline`.
    hello_timeout
        Seconds to wait for the ``hello`` reply (first kernel compilation,
        a browser starting; default ``external_hello_timeout_s``).
    expect_runtime
        If given, the runtime name the worker must announce.
    min_mib_s
        The slowest rate, MiB/s, allowed for the bytes of a request (default
        ``external_min_mib_s``).
    """

    def __init__(
        self,
        connect: Callable[[], Connection],
        *,
        name: str,
        timeout: float | None = None,
        hello_timeout: float | None = None,
        expect_runtime: str | None = None,
        min_mib_s: float | None = None,
    ) -> None:
        from ... import config

        self._connect = connect
        self.name = name
        self.timeout = float(config.get("external_timeout_s") if timeout is None else timeout)
        self.hello_timeout = float(
            config.get("external_hello_timeout_s") if hello_timeout is None else hello_timeout
        )
        self.min_mib_s = float(config.get("external_min_mib_s") if min_mib_s is None else min_mib_s)
        self.expect_runtime = expect_runtime
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._ids = itertools.count(1)
        self._handles = itertools.count(1)
        #: Incremented at every (re)start; handles of older generations are stale.
        self.generation = 0
        #: The worker's ``hello`` of the current generation.
        self.hello: pr.HelloInfo | None = None
        #: Losses seen (each a dict: generation, error, when).
        self.losses: list[dict[str, Any]] = []
        self.closed = False

    # ---------------------------------------------------------------- lifecycle
    @property
    def connected(self) -> bool:
        """Whether a live connection is held."""
        return self._conn is not None and self._conn.alive

    @property
    def connection(self) -> Connection | None:
        """The current connection (``None`` before the first start or after a loss)."""
        return self._conn

    def start(self) -> pr.HelloInfo:
        """Connect (if needed) and handshake; return the worker's ``hello``.

        Raises
        ------
        ProtocolError
            ``version`` if the worker speaks another protocol, or a bad reply.
        ExternalWorkerLostError
            The worker died during the handshake.
        """
        with self._lock:
            if self.closed:
                raise ExternalWorkerError(
                    f"the session with external worker {self.name!r} is closed",
                    worker=self.name,
                )
            if self._conn is not None and self._conn.alive and self.hello is not None:
                return self.hello
            self._drop()
            conn = self._connect()
            self._conn = conn
            self._ids = itertools.count(1)
            self._handles = itertools.count(1)
            try:
                conn.send(pr.hello_request(id=0, client=_client_name()), timeout=self.hello_timeout)
                reply = conn.recv(self.hello_timeout, message_type="hello")
                if reply.type == "error":
                    raise error_from_reply(reply, worker=self.name, message_type="hello")
                if reply.id != 0:
                    raise ProtocolError(
                        f"external worker {self.name!r} answered hello with id {reply.id}, "
                        "expected 0",
                        code="bad_request",
                        worker=self.name,
                        message_type="hello",
                    )
                try:
                    info = pr.parse_hello_reply(reply)
                except ProtocolError as exc:
                    raise self._bad_reply(exc, "hello") from exc
                if self.expect_runtime is not None and info.runtime != self.expect_runtime:
                    raise ProtocolError(
                        f"external worker {self.name!r} implements runtime {info.runtime!r}, "
                        f"expected {self.expect_runtime!r}; start the right worker program",
                        code="bad_request",
                        worker=self.name,
                        message_type="hello",
                    )
            except BaseException:
                self._drop()
                raise
            self.generation += 1
            self.hello = info
            logger.info(
                "external worker %r generation %d: %s",
                self.name,
                self.generation,
                info.implementation,
            )
            return info

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.hello = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close(timeout=2.0)

    def new_handle(self) -> int:
        """Return a handle id not used before in this generation."""
        with self._lock:
            return next(self._handles)

    def close(self, *, timeout: float = 5.0) -> None:
        """Say ``bye`` (best effort) and close the connection; idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            conn = self._conn
            if conn is not None and conn.alive:
                with contextlib.suppress(Exception):
                    conn.send(pr.bye(id=next(self._ids)), timeout=timeout)
                    conn.recv(timeout, message_type="bye")
            self._drop()

    # ---------------------------------------------------------------- requests
    def deadline(self, nbytes: int) -> float:
        """Seconds a request over ``nbytes`` bytes may take.

        :attr:`timeout` plus their time at :attr:`min_mib_s`: a stalled worker is found
        well before a fixed long timeout, a slow device still has the time its bytes need.
        """
        return self.timeout + max(0, int(nbytes)) / (self.min_mib_s * 2**20)

    def request(
        self,
        build: Callable[[int], pr.Message],
        *,
        handle: int | None = None,
        timeout: float | None = None,
        generation: int | None = None,
        work_bytes: int = 0,
    ) -> pr.Message:
        """Send one request and return its reply (not an ``error``).

        Parameters
        ----------
        build
            Makes the request from its id.
        handle
            The handle concerned (named in errors).
        timeout
            Seconds to wait for the reply (default :meth:`deadline` of the message's
            bytes plus ``work_bytes``).
        work_bytes
            Bytes the worker works through for this request (the chunk a run reads).
        generation
            If given, the generation the request belongs to: the request is
            refused (``ExternalWorkerLostError``) when the worker has been
            restarted since, instead of being sent to a worker that does not
            know its handles.

        Raises
        ------
        ExternalWorkerError
            The worker answered ``error`` (``ProtocolError`` for protocol
            codes).
        ExternalWorkerLostError
            The worker died; the next request restarts it.
        ExternalWorkerTimeoutError
            No reply in time; the worker is stopped (a late reply would
            desynchronise the stream) and restarted by the next request.
        """
        with self._lock:
            self.start()
            if generation is not None and generation != self.generation:
                raise ExternalWorkerLostError(
                    f"external worker {self.name!r} restarted (generation {generation} -> "
                    f"{self.generation}); handle {handle} of the old generation is gone",
                    worker=self.name,
                    handle=handle,
                )
            conn = self._conn
            assert conn is not None
            rid = next(self._ids)
            message = build(rid)
            kind = message.type
            self._check_limits(message, handle)
            wait = self.deadline(message.nbytes + work_bytes) if timeout is None else float(timeout)
            t0 = time.monotonic()
            try:
                conn.send(message, timeout=wait, handle=handle)
                reply = conn.recv(wait, message_type=kind, handle=handle)
            except (ExternalWorkerLostError, ExternalWorkerTimeoutError, ProtocolError) as exc:
                self.losses.append(
                    {
                        "generation": self.generation,
                        "message_type": kind,
                        "handle": handle,
                        "error": f"{type(exc).__name__}: {exc}",
                        "after_s": round(time.monotonic() - t0, 3),
                        "exit_code": getattr(exc, "exit_code", None),
                    }
                )
                logger.warning("external worker %r lost during %s: %s", self.name, kind, exc)
                self._drop()
                raise
            if reply.type == "error":
                err = error_from_reply(reply, worker=self.name, message_type=kind, handle=handle)
                if reply.header.get("code") in _FATAL_CODES:
                    self._drop()
                raise err
            if reply.id != rid:
                self._drop()
                raise ProtocolError(
                    f"external worker {self.name!r} answered {kind} id {rid} with a "
                    f"{reply.type} of id {reply.id}; the stream is out of step (restarted)",
                    code="bad_request",
                    worker=self.name,
                    message_type=kind,
                    handle=handle,
                )
            expected = REPLY_TYPES.get(kind)
            if expected is not None and reply.type != expected:
                self._drop()
                raise ProtocolError(
                    f"external worker {self.name!r} answered {kind} id {rid} with a "
                    f"{reply.type!r} reply, expected {expected!r} (docs/protocol.md); the "
                    "worker does not follow the protocol and was stopped (restarted by the "
                    "next request)",
                    code="bad_request",
                    worker=self.name,
                    message_type=kind,
                    handle=handle,
                )
            return reply

    def _check_limits(self, message: pr.Message, handle: int | None) -> None:
        """Refuse, without sending it, a message over the worker's declared limits."""
        if self.hello is None:
            return
        limits = self.hello.limits
        largest = max((v.nbytes for v in message.buffer_views()), default=0)
        if largest > limits["max_buffer_bytes"]:
            raise ProtocolError(
                f"external worker {self.name!r} takes buffers of at most "
                f"{limits['max_buffer_bytes']} bytes; this {message.type} has one of {largest} "
                "bytes. Use smaller chunks (fewer scan rows per chunk)",
                code="too_large",
                worker=self.name,
                message_type=message.type,
                handle=handle,
            )
        total = message.nbytes
        if total > limits["max_message_bytes"]:
            raise ProtocolError(
                f"external worker {self.name!r} takes frames of at most "
                f"{limits['max_message_bytes']} bytes; this {message.type} is {total} bytes. "
                "Use smaller chunks (fewer scan rows per chunk)",
                code="too_large",
                worker=self.name,
                message_type=message.type,
                handle=handle,
            )

    # ---------------------------------------------------------------- messages
    def put(
        self,
        *,
        representation: str,
        payload: Any,
        scan_slice: Any,
        timeout: float | None = None,
    ) -> tuple[int, int, int]:
        """Store a chunk payload; return ``(handle, generation, resident_bytes)``."""
        with self._lock:
            self.start()
            handle = self.new_handle()
            reply = self.request(
                lambda i: pr.put(
                    id=i,
                    handle=handle,
                    representation=representation,
                    payload=payload,
                    scan_slice=scan_slice,
                ),
                handle=handle,
                timeout=timeout,
            )
            return handle, self.generation, _resident(reply, self.name, "put", handle)

    def put_weights(self, weights: np.ndarray) -> tuple[int, int, int, bool]:
        """Store weight rows; return ``(handle, generation, resident_bytes, integer_weights)``."""
        with self._lock:
            self.start()
            handle = self.new_handle()
            w = np.ascontiguousarray(weights, dtype=np.float64)
            reply = self.request(
                lambda i: pr.put_weights(id=i, handle=handle, weights=w), handle=handle
            )
            integer = reply.header.get("integer_weights")
            if not isinstance(integer, bool):
                raise ProtocolError(
                    f"external worker {self.name!r}: put_weights reply lacks a boolean "
                    f"'integer_weights', got {integer!r}",
                    code="bad_request",
                    worker=self.name,
                    message_type="put_weights",
                    handle=handle,
                )
            nbytes = _resident(reply, self.name, "put_weights", handle)
            return handle, self.generation, nbytes, integer

    def run_frame_pass(
        self,
        *,
        chunk: int,
        weights: int,
        generation: int,
        n_frames: int,
        n_weights: int,
        n_pixels: int,
        dtype: Any,
        want_sum: bool,
        want_max: bool,
        timeout: float | None = None,
        work_bytes: int = 0,
    ) -> pr.FramePassOutputs:
        """Run the fused pass on a resident chunk with resident weights."""
        reply = self.request(
            lambda i: pr.run_frame_pass(
                id=i, chunk=chunk, weights=weights, want_sum=want_sum, want_max=want_max
            ),
            handle=chunk,
            timeout=timeout,
            generation=generation,
            work_bytes=work_bytes,
        )
        try:
            return pr.parse_frame_pass_result(
                reply,
                n_frames=n_frames,
                n_weights=n_weights,
                n_pixels=n_pixels,
                dtype=dtype,
                want_sum=want_sum,
                want_max=want_max,
            )
        except ProtocolError as exc:
            raise self._bad_reply(exc, "run", handle=chunk) from exc

    def run_gather(
        self,
        *,
        chunk: int,
        generation: int,
        indices: np.ndarray,
        n_frames: int,
        dtype: Any,
        timeout: float | None = None,
        work_bytes: int = 0,
    ) -> np.ndarray:
        """Gather flat detector pixels of a resident chunk: ``(n_frames, len(indices))``."""
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        reply = self.request(
            lambda i: pr.run_gather(id=i, chunk=chunk, indices=idx),
            handle=chunk,
            timeout=timeout,
            generation=generation,
            work_bytes=work_bytes,
        )
        try:
            return pr.parse_gather_result(reply, n_frames=n_frames, n_indices=idx.size, dtype=dtype)
        except ProtocolError as exc:
            raise self._bad_reply(exc, "run", handle=chunk) from exc

    def _bad_reply(
        self, exc: ProtocolError, message_type: str, *, handle: int | None = None
    ) -> ProtocolError:
        """A reply that does not parse, as this worker's ``ProtocolError``."""
        return ProtocolError(
            f"external worker {self.name!r}: {exc}",
            code=exc.code or "bad_request",
            worker=self.name,
            message_type=message_type,
            handle=handle,
        )

    def release(self, handles: Iterable[int], *, generation: int | None = None) -> list[int]:
        """Free handles; return those the worker freed.

        Handles of an older ``generation`` are already gone with their
        worker: nothing is sent and ``[]`` is returned.
        """
        hs = [int(h) for h in handles]
        with self._lock:
            if not hs or self.closed:
                return []
            if generation is not None and (generation != self.generation or not self.connected):
                return []
            reply = self.request(lambda i: pr.release(id=i, handles=hs), handle=hs[0])
            freed = reply.header.get("released")
            if not isinstance(freed, list):
                raise ProtocolError(
                    f"external worker {self.name!r}: release reply lacks 'released'",
                    code="bad_request",
                    worker=self.name,
                    message_type="release",
                )
            return [int(h) for h in freed]

    def stats(self) -> dict[str, Any]:
        """Return the worker's ``stats`` reply (handles, resident bytes, budget)."""
        reply = self.request(lambda i: pr.stats(id=i))
        return {k: v for k, v in reply.header.items() if k not in ("type", "id")}

    def ping(self) -> float:
        """Round trip of a ``ping``, in seconds."""
        t0 = time.perf_counter()
        self.request(lambda i: pr.ping(id=i))
        return time.perf_counter() - t0

    @property
    def pid(self) -> int | None:
        """Process id of the worker, for a child process."""
        pid = getattr(self._conn, "pid", None)
        return int(pid) if isinstance(pid, int) else None


def _resident(reply: pr.Message, worker: str, kind: str, handle: int) -> int:
    value = reply.header.get("resident_bytes")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(
            f"external worker {worker!r}: the {kind} reply lacks an integer 'resident_bytes', "
            f"got {value!r}",
            code="bad_request",
            worker=worker,
            message_type=kind,
            handle=handle,
        )
    return value
