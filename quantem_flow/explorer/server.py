"""Serve the explorer: a Bokeh server on 127.0.0.1 behind a one-time token.

As Jupyter does, the URL printed carries a random token; the first request
with it sets a signed cookie, and every later request (the page's scripts,
its websocket) must carry either.  Anything else gets 403 and a page saying
how to open the explorer.  ``host`` exposes the server on another interface
only when asked.  The server runs on its own thread and event loop, so it
serves from a notebook kernel, a script or the command line alike.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import threading
from pathlib import Path
from typing import Any

from ..dataset import Dataset4D
from ..errors import ParameterError
from .export import InputSpec, input_spec_of
from .session import ExplorerSession

__all__ = ["Explorer", "explore"]

logger = logging.getLogger(__name__)

APP_PATH = "/explore"
COOKIE = "quantem_flow_explore"


def _token_auth(token: str) -> Any:
    """A Bokeh auth provider admitting the token (query argument) or its signed cookie."""
    from bokeh.server.auth_provider import AuthProvider
    from tornado.web import RequestHandler

    class Refused(RequestHandler):
        def get(self) -> None:
            self.set_status(403)
            self.write(
                "<h1>quantem-flow explore</h1><p>This explorer needs the URL with its token, "
                "as printed by <code>quantem-flow explore</code> or shown by "
                "<code>qf.explore</code>.</p>"
            )

    from tornado.websocket import WebSocketHandler

    def get_user(handler: Any) -> str | None:
        if handler.get_secure_cookie(COOKIE) == b"1":
            return "user"
        given = handler.get_argument("token", None)
        if given is not None and hmac.compare_digest(str(given), token):
            if not isinstance(handler, WebSocketHandler):  # a websocket sets no cookie
                handler.set_secure_cookie(COOKIE, "1", httponly=True, samesite="Strict")
            return "user"
        return None

    class TokenAuth(AuthProvider):
        @property
        def get_user(self) -> Any:
            return get_user

        @property
        def login_url(self) -> str:
            return "/refused"

        @property
        def login_handler(self) -> Any:
            return Refused

    return TokenAuth()


class Explorer:
    """A running explorer: its URL, its session, and how to stop it.

    Made by :func:`explore`.  Shown in a notebook, it is the explorer itself
    (an inline frame); :meth:`close` stops the server and releases the
    resident chunks persisted for it.

    Attributes
    ----------
    url
        The page's URL, token included.
    session
        The shared state (:class:`~quantem_flow.explorer.session.ExplorerSession`).
    """

    def __init__(
        self,
        session: ExplorerSession,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        input_spec: InputSpec | None = None,
        export_dir: str | Path = "quantem-flow-explore",
    ):
        self.session = session
        self.token = secrets.token_urlsafe(24)
        self._host = host
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._input_spec = input_spec
        self._export_dir = str(Path(export_dir).resolve())
        self._thread = threading.Thread(
            target=self._serve, args=(port,), name="qf-explore-server", daemon=True
        )
        self._thread.start()
        self._ready.wait(timeout=60)
        if self._error is not None:
            raise self._error
        if self._server is None:
            raise RuntimeError("the explorer's server did not start within 60 s")
        self.port: int = int(self._server.port)
        shown_host = "127.0.0.1" if host in ("127.0.0.1", "localhost") else host
        self.url: str = f"http://{shown_host}:{self.port}{APP_PATH}?token={self.token}"

    def _serve(self, port: int) -> None:
        from bokeh.application import Application
        from bokeh.application.handlers.function import FunctionHandler
        from bokeh.server.server import Server
        from tornado.ioloop import IOLoop

        from .app import make_document

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            app = Application(
                FunctionHandler(
                    lambda doc: make_document(
                        doc, self.session, input_spec=self._input_spec,
                        export_dir=self._export_dir,
                    )
                )
            )  # fmt: skip
            origins = ["*"] if self._host not in ("127.0.0.1", "localhost") else None
            server = Server(
                {APP_PATH: app},
                io_loop=IOLoop.current(),
                address=self._host,
                port=port,
                allow_websocket_origin=origins or [f"127.0.0.1:{port}", f"localhost:{port}"],
                auth_provider=_token_auth(self.token),
                cookie_secret=secrets.token_urlsafe(32),
                check_unused_sessions_milliseconds=2000,
                unused_session_lifetime_milliseconds=5000,
            )
            if origins is None and port == 0:  # the port is known only now
                server._tornado._websocket_origins = {
                    f"127.0.0.1:{server.port}",
                    f"localhost:{server.port}",
                }
            server.start()
            self._server = server
        except BaseException as exc:  # reported by the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._stopped.set()

    def close(self, *, release: bool = True, keep_session: bool = False) -> None:
        """Stop the server and the session (releasing the chunks it persisted).

        ``keep_session``: stop the server only (another server may serve the session).
        """
        loop = self._loop
        if loop is not None and self._server is not None and not self._stopped.is_set():

            def stop() -> None:
                try:
                    self._server.stop()
                finally:
                    loop.stop()

            loop.call_soon_threadsafe(stop)
            self._thread.join(timeout=10)
        if not keep_session:
            self.session.close(release=release)

    def __enter__(self) -> Explorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Explorer(url={self.url!r})"

    def _repr_html_(self) -> str:
        return (
            f'<iframe src="{self.url}" width="100%" height="1050" frameborder="0"></iframe>'
            f'<p><a href="{self.url}" target="_blank">Open the explorer in its own tab</a></p>'
        )


def _kept_input(live: Any) -> InputSpec:
    """The HDF5 a live series is kept in, as the exported pipeline's input."""
    path = Path(live.hdf5_path)
    if path.name.endswith("_master.h5"):  # DECTRIS layout: the sidecar gives the scan shape
        return InputSpec(path=str(path), format="dectris", options={})
    return InputSpec(
        path=str(path),
        format="hdf5",
        options={"dataset_path": "/entry/data/data", "scan_shape": list(live.scan_shape)},
    )


def explore(
    ds: Dataset4D | Any,
    *,
    client: Any = None,
    host: str = "127.0.0.1",
    port: int = 0,
    input_spec: InputSpec | None = None,
    export_dir: str | Path = "quantem-flow-explore",
) -> Explorer:
    """Explore a dataset interactively: virtual detectors on its pattern, images that follow.

    Persists ``ds`` on the cluster (unless it is persisted already) and
    serves the explorer page on ``host`` (loopback by default) behind a
    one-time token.  In a notebook the returned :class:`Explorer` shows the
    page inline; elsewhere open :attr:`Explorer.url`.

    Parameters
    ----------
    ds
        The dataset, or a live acquisition (:func:`quantem_flow.live`): the
        explorer opens on the rows received so far and follows the scan (its
        images fill in; rows not yet received are blank), and the exported
        pipeline reads the HDF5 the series is kept in (``keep_hdf5=``).
    client
        ``None`` (the embedded local cluster), a ``distributed.Client``,
        ``"threads"`` or ``"synchronous"`` (this process).
    host
        Interface to serve on; anything but ``127.0.0.1``/``localhost``
        exposes the explorer to other machines (the token still guards it).
    port
        TCP port; ``0`` picks a free one.
    input_spec
        How to open the file again, for the exported pipeline (default:
        what the dataset records, :func:`~quantem_flow.explorer.export.input_spec_of`).
    export_dir
        Folder the Export button writes to.

    Returns
    -------
    Explorer
        The running explorer (``.url``, ``.close()``).
    """
    live = None
    if hasattr(ds, "dataset_so_far") and hasattr(ds, "rows_complete"):  # qf.live(...)
        live = ds
        ds = live.dataset_so_far()
        if input_spec is None and getattr(live, "hdf5_path", None) is not None:
            input_spec = _kept_input(live)
    elif not isinstance(ds, Dataset4D):
        raise ParameterError(
            f"explore takes a Dataset4D (qf.open(...)) or a live acquisition (qf.live(...)), "
            f"got {type(ds).__name__}"
        )
    session = ExplorerSession(ds, client=client, live=live)
    try:
        return Explorer(
            session,
            host=host,
            port=port,
            input_spec=input_spec
            if input_spec is not None or live is not None
            else input_spec_of(ds),
            export_dir=export_dir,
        )
    except BaseException:
        session.close()
        raise
