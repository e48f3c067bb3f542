"""Transports of ``qf-worker/1`` frames: pipes to a child process, and a loopback WebSocket.

Both give one :class:`Connection` interface: ``send(message)``,
``recv(timeout) -> Message`` and ``close()``.  Nothing blocks without a
bound: every read waits at most its timeout and wakes up when the peer
dies (a child process's exit, a closed socket), raising
:class:`~quantem_flow.errors.ExternalWorkerLostError` with the exit code
and the tail of the child's stderr.

* :class:`PipeConnection` starts the worker as a child process; frames go
  on its stdin and come back on its stdout (a reader thread feeds a
  :class:`~.protocol.FrameDecoder`); stderr is kept in a bounded ring.
* :class:`WebSocketServer` listens on ``127.0.0.1`` (tornado, on its own
  IOLoop thread), serves a static page directory at ``/`` and the socket at
  ``/qf-worker``, both behind a one-time token; :meth:`WebSocketServer.accept`
  returns the :class:`WebSocketConnection` of the page that connected.
  :func:`launch_chromium` opens the page in headless Chromium.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import mimetypes
import os
import queue
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ...errors import (
    ExternalWorkerLostError,
    ExternalWorkerTimeoutError,
    ParameterError,
    ProtocolError,
    RuntimeUnavailableError,
)
from .protocol import FrameDecoder, Message, decode, encode, encode_pieces

__all__ = [
    "CHROMIUM_FLAGS",
    "Connection",
    "PipeConnection",
    "WebSocketConnection",
    "WebSocketServer",
    "launch_chromium",
]

#: Default largest frame a transport accepts from a worker (results are small).
DEFAULT_MAX_RECEIVE = 1 << 30

_READ_CHUNK = 1 << 20


class Connection(Protocol):
    """What a transport gives the session: one frame in, one frame out."""

    name: str

    def send(
        self, message: Message, *, timeout: float | None = None, handle: int | None = None
    ) -> None:
        """Send one message (raises ``ExternalWorkerLostError`` if the peer is gone)."""

    def recv(
        self, timeout: float, *, message_type: str | None = None, handle: int | None = None
    ) -> Message:
        """Return the next message, waiting at most ``timeout`` seconds."""

    def close(self, *, timeout: float = 5.0) -> None:
        """Close the connection and end the peer (idempotent)."""

    @property
    def alive(self) -> bool:
        """Whether the peer is still there."""


class _Ended:
    """Queue sentinel: the stream ended (cleanly, truncated, or with a bad frame)."""

    def __init__(self, reason: str, error: ProtocolError | None = None) -> None:
        self.reason = reason
        self.error = error


class PipeConnection:
    """A worker child process speaking ``qf-worker/1`` on its stdin and stdout.

    Parameters
    ----------
    argv
        The command line of the worker.
    name
        Worker name used in error messages.
    env
        Extra environment variables for the child (added to this process's).
    cwd
        Working directory of the child.
    max_message_bytes
        Refuse larger frames from the worker (``too_large``).
    stderr_lines
        Lines of the child's stderr kept for error reports.
    stall_grace_s
        Seconds the child may stay stopped (state ``T``: SIGSTOP, a debugger) while
        a reply is awaited before :meth:`recv` reports it stalled (default
        ``qf.config`` ``external_stall_grace_s``; Linux, where ``/proc`` says it).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        max_message_bytes: int = DEFAULT_MAX_RECEIVE,
        stderr_lines: int = 200,
        stall_grace_s: float | None = None,
    ) -> None:
        from ... import config

        self.name = name
        self.stall_grace_s = float(
            config.get("external_stall_grace_s") if stall_grace_s is None else stall_grace_s
        )
        self.argv = [str(a) for a in argv]
        full_env = {**os.environ, **(env or {})}
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                env=full_env,
                cwd=cwd,
                close_fds=True,
            )
        except OSError as exc:
            raise RuntimeUnavailableError(
                f"external worker {name!r}: cannot start {self.argv!r} ({exc}); check that the "
                "program exists and is executable"
            ) from exc
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin_fd = self.process.stdin.fileno()
        for fd in (self._stdin_fd, self.process.stdout.fileno()):
            _grow_pipe(fd)
        os.set_blocking(self._stdin_fd, False)
        self._messages: queue.Queue[Message | _Ended] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._send_lock = threading.Lock()
        self._closed = False
        self._decoder = FrameDecoder(max_message_bytes=max_message_bytes)
        self._reader = threading.Thread(
            target=self._read_stdout, name=f"qf-worker {name} stdout", daemon=True
        )
        self._err_reader = threading.Thread(
            target=self._read_stderr, name=f"qf-worker {name} stderr", daemon=True
        )
        self._reader.start()
        self._err_reader.start()

    # -------------------------------------------------------------- reader threads
    def _read_stdout(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        fd = stdout.fileno()
        try:
            while True:
                try:
                    data = os.read(fd, _READ_CHUNK)
                except OSError as exc:
                    self._messages.put(_Ended(f"reading stdout failed: {exc}"))
                    return
                if not data:
                    try:
                        self._decoder.close()
                    except ProtocolError as exc:
                        self._messages.put(_Ended("stdout ended inside a frame", exc))
                        return
                    self._messages.put(_Ended("stdout closed"))
                    return
                for message in self._decoder.feed(data):
                    self._messages.put(message)
        except ProtocolError as exc:
            self._messages.put(_Ended("the worker wrote a malformed frame", exc))
        except BaseException as exc:  # anything else reaches the waiting request at once
            self._messages.put(
                _Ended(
                    "the bridge's reader failed",
                    ProtocolError(
                        f"reading the worker's frames failed: {type(exc).__name__}: {exc}",
                        code="frame",
                        worker=self.name,
                    ),
                )
            )

    def _read_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        with contextlib.suppress(OSError, ValueError):
            for raw in iter(stderr.readline, b""):
                self._stderr.append(raw[:2000].decode("utf-8", "replace").rstrip("\n"))

    # -------------------------------------------------------------- state
    @property
    def pid(self) -> int:
        """Process id of the child."""
        return int(self.process.pid)

    @property
    def alive(self) -> bool:
        """Whether the child is running."""
        return self.process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The child's exit status (negative: killed by that signal), or ``None``."""
        return self.process.poll()

    def stderr_tail(self, lines: int = 20) -> str:
        """Return the last ``lines`` lines the child wrote to stderr."""
        self._err_reader.join(timeout=0.2) if not self.alive else None
        return "\n".join(list(self._stderr)[-lines:])

    def _lost(
        self, what: str, *, message_type: str | None, handle: int | None
    ) -> ExternalWorkerLostError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2.0)
        code = self.exit_code
        tail = self.stderr_tail()
        status = (
            f"exit code {code}"
            if code is None or code >= 0
            else f"killed by signal {-code} ({_signal_name(-code)})"
        )
        return ExternalWorkerLostError(
            f"external worker {self.name!r} ({' '.join(self.argv)}, pid {self.pid}) {what} "
            f"during {message_type or 'a request'}"
            + (f" on handle {handle}" if handle is not None else "")
            + f": {status}; stderr tail:\n{tail or '(empty)'}\n"
            "Its resident handles are gone; the bridge restarts it on the next call and "
            "re-places the chunks",
            worker=self.name,
            message_type=message_type,
            handle=handle,
            exit_code=code,
            stderr_tail=tail,
        )

    # -------------------------------------------------------------- Connection
    def send(
        self,
        message: Message,
        *,
        timeout: float | None = None,
        handle: int | None = None,
    ) -> None:
        """Write one frame to the child's stdin.

        Raises
        ------
        ExternalWorkerLostError
            The child has exited (broken pipe).
        ExternalWorkerTimeoutError
            The child did not read the frame within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._send_lock:
            for piece in encode_pieces(message):
                view = memoryview(piece).cast("B")
                while view.nbytes:
                    if not self.alive:
                        raise self._lost("exited", message_type=message.type, handle=handle)
                    wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                    if wait <= 0:
                        raise ExternalWorkerTimeoutError(
                            f"external worker {self.name!r} did not read a {message.type} frame "
                            f"within {timeout} s; it may be stuck: restart it",
                            worker=self.name,
                            message_type=message.type,
                            handle=handle,
                        )
                    _, writable, _ = select.select([], [self._stdin_fd], [], wait)
                    if not writable:
                        continue
                    try:
                        n = os.write(self._stdin_fd, view)
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError) as exc:
                        raise self._lost(
                            f"closed its stdin ({exc})", message_type=message.type, handle=handle
                        ) from exc
                    view = view[n:]

    def recv(
        self, timeout: float, *, message_type: str | None = None, handle: int | None = None
    ) -> Message:
        """Return the next frame from the child.

        Parameters
        ----------
        timeout
            Seconds to wait at most.
        message_type, handle
            The request waited for, named in errors.

        Raises
        ------
        ExternalWorkerLostError
            The child exited, or its stdout ended (the exit code and stderr
            tail are in the error).
        ProtocolError
            The child wrote a malformed frame (the child is then killed).
        ExternalWorkerTimeoutError
            Nothing arrived in time (the child is still running).
        """
        deadline = time.monotonic() + timeout
        stopped_since: float | None = None
        while True:
            try:
                item = self._messages.get(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
            except queue.Empty:
                if self._stopped():  # a liveness check while the request runs
                    now = time.monotonic()
                    stopped_since = stopped_since or now
                    if now - stopped_since >= self.stall_grace_s:
                        pid = self.pid
                        self._kill()
                        raise ExternalWorkerTimeoutError(
                            f"external worker {self.name!r} (pid {pid}) stalled: its process "
                            f"was stopped (SIGSTOP or a debugger) for {self.stall_grace_s:g} s "
                            f"during {message_type or 'a request'}"
                            + (f" on handle {handle}" if handle is not None else "")
                            + "; it was killed (the runtime restarts it and re-runs the request "
                            "once)",
                            code="stalled",
                            worker=self.name,
                            message_type=message_type,
                            handle=handle,
                        ) from None
                else:
                    stopped_since = None
                if not self.alive and self._messages.empty():
                    self._reader.join(timeout=1.0)
                    if self._messages.empty():
                        raise self._lost(
                            "exited", message_type=message_type, handle=handle
                        ) from None
                    continue
                if time.monotonic() >= deadline:
                    pid = self.pid
                    self._kill()  # a late reply would put the stream out of step
                    raise ExternalWorkerTimeoutError(
                        f"external worker {self.name!r} (pid {pid}) did not answer "
                        f"{message_type or 'a request'}"
                        + (f" on handle {handle}" if handle is not None else "")
                        + f" within {timeout:.1f} s (its deadline: qf.config "
                        "external_timeout_s, or external_hello_timeout_s for hello, plus the "
                        "request's bytes at external_min_mib_s); it was killed. Raise those "
                        "settings for a slow device, or check the worker",
                        code="timeout",
                        worker=self.name,
                        message_type=message_type,
                        handle=handle,
                    ) from None
                continue
            if isinstance(item, Message):
                return item
            self._messages.put(item)  # every later recv reports the same end
            if item.error is not None and self.alive:
                self._kill()
                err = item.error
                raise ProtocolError(
                    f"external worker {self.name!r} wrote a malformed frame ({err}); it was "
                    f"stopped. stderr tail:\n{self.stderr_tail() or '(empty)'}",
                    code=err.code or "frame",
                    worker=self.name,
                    message_type=message_type,
                    handle=handle,
                )
            raise self._lost(
                item.reason if item.error is None else f"{item.reason} ({item.error})",
                message_type=message_type,
                handle=handle,
            )

    def _stopped(self) -> bool:
        """Whether the child is stopped (``/proc/<pid>/stat`` state ``T`` or ``t``; Linux)."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            return False
        end = stat.rfind(b")")
        return end >= 0 and stat[end + 2 : end + 3] in (b"T", b"t")

    def _kill(self) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)

    def close(self, *, timeout: float = 5.0) -> None:
        """Close stdin (the worker's ``bye``), wait up to ``timeout`` s, then kill it."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        self._reader.join(timeout=2.0)
        self._err_reader.join(timeout=2.0)
        for stream in (self.process.stdout, self.process.stderr):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


#: Pipe capacity asked for (Linux ``F_SETPIPE_SZ``; 64 KiB by default): fewer wake-ups
#: per large frame.  Refused (unprivileged limit) or not Linux: the default stays.
PIPE_BYTES = 1 << 20


def _grow_pipe(fd: int) -> None:
    import fcntl

    set_size = getattr(fcntl, "F_SETPIPE_SZ", 1031 if sys.platform.startswith("linux") else None)
    if set_size is None:
        return
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, set_size, PIPE_BYTES)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


# ============================================================================ WebSocket


class WebSocketConnection:
    """The bridge's side of one page's WebSocket (made by :meth:`WebSocketServer.accept`)."""

    def __init__(self, server: WebSocketServer, handler: Any) -> None:
        self.name = server.name
        self._server = server
        self._handler = handler
        self._messages: queue.Queue[Message | _Ended] = queue.Queue()
        self._open = True

    @property
    def alive(self) -> bool:
        """Whether the socket is open."""
        return self._open

    def _deliver(self, data: bytes) -> None:
        try:
            self._messages.put(decode(data, max_message_bytes=self._server.max_message_bytes))
        except Exception as exc:  # a malformed frame, or anything the decoder met
            error = (
                exc
                if isinstance(exc, ProtocolError)
                else ProtocolError(
                    f"decoding the page's frame failed: {type(exc).__name__}: {exc}",
                    code="frame",
                    worker=self.name,
                )
            )
            self._messages.put(_Ended("the page sent a malformed frame", error))
            self._server._call(self._handler.close, 1002, "malformed qf-worker frame")

    def _closed(self, reason: str) -> None:
        self._open = False
        self._messages.put(_Ended(reason))

    def _lost(
        self, what: str, message_type: str | None, handle: int | None
    ) -> ExternalWorkerLostError:
        return ExternalWorkerLostError(
            f"external worker {self.name!r} (browser page over {self._server.base_url}) {what} "
            f"during {message_type or 'a request'}"
            + (f" on handle {handle}" if handle is not None else "")
            + "; its resident handles are gone. Reopen the worker page (a new URL and token) "
            "to bring it back",
            worker=self.name,
            message_type=message_type,
            handle=handle,
        )

    def send(
        self, message: Message, *, timeout: float | None = None, handle: int | None = None
    ) -> None:
        """Send one frame as one binary WebSocket message."""
        if not self._open:
            raise self._lost("closed its socket", message.type, handle)
        data = encode(message)

        async def write() -> None:
            await self._handler.write_message(data, binary=True)

        try:
            self._server._run(write(), timeout=timeout)
        except TimeoutError as exc:
            raise ExternalWorkerTimeoutError(
                f"external worker {self.name!r} did not take a {message.type} frame within "
                f"{timeout} s",
                worker=self.name,
                message_type=message.type,
                handle=handle,
            ) from exc
        except Exception as exc:  # WebSocketClosedError and friends
            self._open = False
            raise self._lost(f"closed its socket ({exc!r})", message.type, handle) from exc

    def recv(
        self, timeout: float, *, message_type: str | None = None, handle: int | None = None
    ) -> Message:
        """Return the next frame from the page (see :meth:`PipeConnection.recv`)."""
        try:
            item = self._messages.get(timeout=timeout)
        except queue.Empty:
            raise ExternalWorkerTimeoutError(
                f"external worker {self.name!r} (browser page) did not answer "
                f"{message_type or 'a request'} within {timeout} s",
                worker=self.name,
                message_type=message_type,
                handle=handle,
            ) from None
        if isinstance(item, Message):
            return item
        self._messages.put(item)
        if item.error is not None:
            raise ProtocolError(
                f"external worker {self.name!r} sent a malformed frame ({item.error}); the "
                "socket was closed",
                code=item.error.code or "frame",
                worker=self.name,
                message_type=message_type,
                handle=handle,
            )
        raise self._lost(item.reason, message_type, handle)

    def close(self, *, timeout: float = 5.0) -> None:
        """Close the socket (idempotent)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self._server._call(self._handler.close, 1000, "bye")


class WebSocketServer:
    """A token-guarded loopback HTTP + WebSocket server for one browser worker page.

    ``GET /?token=T`` (and any file of ``page_dir`` with ``?token=T``, or
    with the cookie the first page load sets) serves the page;
    ``/qf-worker?token=T`` is the WebSocket, one binary message per frame.
    The token is 128 random bits, URL-safe, and one-time: after a socket
    has connected with it, every request with it (page or socket) gets
    HTTP 403, as does any request with a wrong or missing token.

    Parameters
    ----------
    name
        Worker name used in error messages.
    page_dir
        Directory served at ``/`` (``index.html`` for ``/``); ``None``
        serves only the socket.
    host
        Address to bind; ``127.0.0.1`` unless the user passes another.
    port
        Port; 0 picks a free one.
    max_message_bytes
        Largest WebSocket message accepted from the page.
    """

    def __init__(
        self,
        *,
        name: str,
        page_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_bytes: int = DEFAULT_MAX_RECEIVE,
    ) -> None:
        self.name = name
        self.page_dir = None if page_dir is None else Path(page_dir).resolve()
        self.host = host
        self.max_message_bytes = int(max_message_bytes)
        self.token = secrets.token_urlsafe(16)
        self._cookie = secrets.token_urlsafe(16)
        self._spent = False
        self._connections: queue.Queue[WebSocketConnection] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._serve, args=(port,), daemon=True, name=f"qf-worker {name} websocket"
        )
        self._thread.start()
        if not self._started.wait(timeout=10.0) or self._error is not None:
            raise RuntimeUnavailableError(
                f"external worker {name!r}: the WebSocket server on {host}:{port} did not start "
                f"({self._error!r})"
            )

    # -------------------------------------------------------------- the IOLoop thread
    def _serve(self, port: int) -> None:
        import tornado.httpserver
        import tornado.netutil
        import tornado.web
        import tornado.websocket

        server = self

        def authorised(handler: tornado.web.RequestHandler, *, socket: bool) -> bool:
            token = handler.get_query_argument("token", default=None)
            if (
                token is not None
                and not server._spent
                and secrets.compare_digest(token, server.token)
            ):
                return True
            if socket:
                return False
            cookie = handler.get_cookie("qfw_page")
            return (
                cookie is not None
                and not server._spent
                and secrets.compare_digest(cookie, server._cookie)
            )

        class Socket(tornado.websocket.WebSocketHandler):
            connection: WebSocketConnection | None = None

            async def get(self, *args: Any, **kwargs: Any) -> None:
                if not authorised(self, socket=True):
                    self.set_status(403)
                    self.finish("403: wrong, missing or already used token")
                    return
                # tornado refuses a request of another Origin (403) or without an upgrade
                # (400) here; such a refusal must not spend the token, so it is spent in
                # open(), on an accepted upgrade only
                await super().get(*args, **kwargs)

            def open(self, *args: Any, **kwargs: Any) -> None:
                if server._spent:  # two upgrades raced past the check: the first one wins
                    self.close(1008, "the token was already used")
                    return
                server._spent = True  # one-time: the first accepted upgrade spends it
                self.set_nodelay(True)
                self.connection = WebSocketConnection(server, self)
                server._connections.put(self.connection)

            def on_message(self, message: str | bytes) -> None:
                assert self.connection is not None
                if isinstance(message, str):
                    self.connection._deliver(b"text messages are not frames")
                else:
                    self.connection._deliver(message)

            def on_close(self) -> None:
                if self.connection is not None:
                    code = self.close_code
                    self.connection._closed(f"closed its socket (code {code})")

        class Page(tornado.web.RequestHandler):
            def get(self, path: str) -> None:
                if not authorised(self, socket=False):
                    self.set_status(403)
                    self.finish("403: wrong, missing or already used token")
                    return
                if server.page_dir is None:
                    self.set_status(404)
                    self.finish("no page directory is served")
                    return
                target = (server.page_dir / (path or "index.html")).resolve()
                if server.page_dir not in target.parents or not target.is_file():
                    self.set_status(404)
                    self.finish("not found")
                    return
                kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                if target.suffix in (".js", ".mjs"):
                    kind = "text/javascript"
                self.set_header("Content-Type", kind)
                self.set_header("Cache-Control", "no-store")
                self.set_cookie("qfw_page", server._cookie, httponly=True, samesite="Strict")
                self.finish(target.read_bytes())

        try:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            app = tornado.web.Application(
                [(r"/qf-worker", Socket), (r"/(.*)", Page)],
                websocket_max_message_size=self.max_message_bytes,
            )
            sockets = tornado.netutil.bind_sockets(port, address=self.host)
            http = tornado.httpserver.HTTPServer(app, max_body_size=1 << 20)
            http.add_sockets(sockets)
            self.port = int(sockets[0].getsockname()[1])
            self._http = http
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _call(self, fn: Any, *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def _run(self, coro: Any, *, timeout: float | None) -> Any:
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout=timeout)
        except TimeoutError:
            fut.cancel()
            raise

    # -------------------------------------------------------------- public
    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (no token)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The page URL to open (loopback, with the one-time token)."""
        return f"{self.base_url}/?token={self.token}"

    @property
    def socket_url(self) -> str:
        """The WebSocket URL, with the token (what the page connects to)."""
        return f"ws{self.base_url[4:]}/qf-worker?token={self.token}"

    def accept(self, timeout: float) -> WebSocketConnection:
        """Wait for the page to connect; return its connection.

        Raises
        ------
        ExternalWorkerTimeoutError
            No page connected within ``timeout`` seconds.
        """
        try:
            return self._connections.get(timeout=timeout)
        except queue.Empty:
            raise ExternalWorkerTimeoutError(
                f"external worker {self.name!r}: no page connected within {timeout} s; open "
                f"{self.url} in a browser with WebGPU",
                worker=self.name,
            ) from None

    def close(self) -> None:
        """Stop the server and its IOLoop thread (idempotent)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def stop() -> None:
            self._http.stop()
            await asyncio.wait_for(self._http.close_all_connections(), timeout=2.0)

        with contextlib.suppress(Exception):
            self._run(stop(), timeout=3.0)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5.0)


# ============================================================================ Chromium

#: Flags that work for headless Chromium with WebGPU on these machines (NATIVE_NOTES.md).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-webgpu",
)


class ChromiumProcess:
    """A headless Chromium (under its watchdog) pointed at a worker page.

    :meth:`close` kills the watchdog's process group (the browser and all its
    processes) and removes the profile.
    """

    def __init__(self, process: subprocess.Popen[bytes], profile: str) -> None:
        self.process = process
        self.profile = profile

    @property
    def pid(self) -> int:
        """Process id of the watchdog, which leads the browser's process group."""
        return int(self.process.pid)

    def close(self) -> None:
        """Kill the browser (its whole process group) and remove its profile directory."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        shutil.rmtree(self.profile, ignore_errors=True)


def launch_chromium(
    url: str,
    *,
    executable: str | None = None,
    extra_args: Sequence[str] = (),
) -> ChromiumProcess:
    """Open ``url`` in headless Chromium with WebGPU enabled and a fresh profile.

    Parameters
    ----------
    url
        The worker page (:attr:`WebSocketServer.url`).
    executable
        The browser; default ``$QF_CHROMIUM`` or ``chromium`` on ``PATH``.
    extra_args
        More command-line flags.

    Returns
    -------
    ChromiumProcess
        Close it to kill the browser; it runs in its own process group.

    Raises
    ------
    RuntimeUnavailableError
        No Chromium is installed.
    """
    exe = executable or os.environ.get("QF_CHROMIUM") or shutil.which("chromium")
    if exe is None:
        exe = shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        raise RuntimeUnavailableError(
            "no Chromium found (looked for $QF_CHROMIUM, chromium, chromium-browser, "
            "google-chrome); install it (Debian: apt-get install chromium) or open the worker "
            f"URL in your own browser: {url}"
        )
    if not url.startswith(("http://127.0.0.1", "http://[::1]", "http://localhost")):
        raise ParameterError(f"launch_chromium opens loopback worker pages only, got {url!r}")
    profile = tempfile.mkdtemp(prefix="qf-chromium-")
    argv = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra_args, url]
    # The browser runs under a small watchdog that leads its process group: when this
    # process goes away (even by SIGKILL) the watchdog kills the group and removes the
    # profile, so no headless browser outlives the bridge that launched it.
    process = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), profile, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return ChromiumProcess(process, profile)


_WATCHDOG = """
import os, shutil, signal, subprocess, sys, time
parent, profile, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
while child.poll() is None and os.getppid() == parent:
    time.sleep(0.5)
shutil.rmtree(profile, ignore_errors=True)
os.killpg(0, signal.SIGKILL)
"""
