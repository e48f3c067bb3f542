"""The loopback WebSocket transport: token-guarded page and socket, a Python page as worker."""

from __future__ import annotations

import asyncio
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantem_flow.errors import ExternalWorkerLostError, ExternalWorkerTimeoutError, ProtocolError
from quantem_flow.representations.chunk import chunk_of
from quantem_flow.runtimes.external import protocol as pr
from quantem_flow.runtimes.external.bridge import ExternalRuntime
from quantem_flow.runtimes.external.reference_worker import ReferenceWorker, serve_websocket
from quantem_flow.runtimes.external.transport import WebSocketServer


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WebSocketServer]:
    (tmp_path / "index.html").write_text("<script src='worker.js'></script>")
    (tmp_path / "worker.js").write_text("console.log('page')")
    srv = WebSocketServer(name="ws-test", page_dir=tmp_path)
    yield srv
    srv.close()


def _page(url: str, worker: ReferenceWorker) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["close"] = asyncio.run(serve_websocket(url, worker, idle_timeout=30))
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_loopback_and_token_shape(server: WebSocketServer) -> None:
    assert server.url.startswith("http://127.0.0.1:") and "?token=" in server.url
    assert len(server.token) >= 22  # 128 bits, URL-safe
    assert server.socket_url.startswith("ws://127.0.0.1:")
    other = WebSocketServer(name="other")
    try:
        assert other.token != server.token and other.port != server.port
    finally:
        other.close()


def test_page_requires_the_token(server: WebSocketServer) -> None:
    assert _get(server.base_url + "/")[0] == 403
    assert _get(server.base_url + "/?token=wrong")[0] == 403
    assert _get(server.base_url + "/worker.js")[0] == 403
    status, body, headers = _get(server.url)
    assert status == 200 and b"worker.js" in body
    cookie = headers["Set-Cookie"].split(";")[0]
    # assets load with the page's cookie (relative URLs carry no token) or the token
    status, body, _ = _get(server.base_url + "/worker.js", {"Cookie": cookie})
    assert status == 200 and b"console.log" in body
    assert _get(server.base_url + f"/worker.js?token={server.token}")[0] == 200
    assert _get(server.base_url + "/../etc/passwd?token=" + server.token)[0] in (403, 404)
    assert _get(server.base_url + "/missing.js?token=" + server.token)[0] == 404


def test_socket_requires_the_token_once(server: WebSocketServer) -> None:
    import tornado.httpclient
    import tornado.websocket

    async def connect(url: str) -> Any:
        return await tornado.websocket.websocket_connect(url)

    for bad in (server.socket_url.split("?")[0], server.socket_url + "x"):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            asyncio.run(connect(bad))
        assert info.value.code == 403
    thread, result = _page(server.socket_url, ReferenceWorker())
    conn = server.accept(30)
    conn.send(pr.hello_request(client="t"))
    assert conn.recv(10).header["runtime"] == "external-reference"
    # the token is spent: a second socket and the page itself are refused
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        asyncio.run(connect(server.socket_url))
    assert info.value.code == 403
    assert _get(server.url)[0] == 403
    conn.send(pr.bye(id=1))
    assert conn.recv(10).type == "bye"
    thread.join(10)
    assert result == {"close": None}
    with pytest.raises(ExternalWorkerLostError, match="closed its socket"):
        conn.recv(5)
    with pytest.raises(ExternalWorkerLostError):
        conn.send(pr.ping(id=2))


def test_accept_times_out_with_the_url(server: WebSocketServer) -> None:
    with pytest.raises(ExternalWorkerTimeoutError, match=r"open http://127\.0\.0\.1"):
        server.accept(0.2)


def test_malformed_frame_from_the_page(server: WebSocketServer) -> None:
    import tornado.websocket

    async def bad_page() -> None:
        ws = await tornado.websocket.websocket_connect(server.socket_url)
        await ws.write_message(b"QFW1 this is not a frame", binary=True)
        await ws.read_message()
        ws.close()

    thread = threading.Thread(target=lambda: asyncio.run(bad_page()), daemon=True)
    thread.start()
    conn = server.accept(30)
    with pytest.raises(ProtocolError) as info:
        conn.recv(10)
    assert info.value.code == "frame" and info.value.worker == "ws-test"
    thread.join(10)


def test_bridge_runtime_over_websocket(rng: np.random.Generator) -> None:
    servers: list[WebSocketServer] = []

    def connect() -> Any:
        srv = WebSocketServer(name="ws-bridge")
        servers.append(srv)
        _page(srv.socket_url, ReferenceWorker(runtime="webgpu-test"))
        return srv.accept(30)

    rt = ExternalRuntime(connect=connect, name="ws-bridge")
    try:
        assert rt.hello.runtime == "webgpu-test"
        block = rng.integers(0, 50, size=(2, 3, 4, 5)).astype(np.uint16)
        chunk = rt.put(chunk_of("dense", block), reload=lambda: block)
        w = np.ones((1, 20))
        out = rt.run_frame_pass(chunk, w, want_sum=True, want_max=False)
        np.testing.assert_array_equal(out.per_frame[:, 0], block.reshape(6, 20).sum(axis=1))
        # the page goes away: the next call opens a new page (new token) and re-places
        conn = rt.session.connection
        assert conn is not None
        conn.close()
        again = rt.run_frame_pass(chunk, w, want_sum=True, want_max=False)
        np.testing.assert_array_equal(again.per_frame, out.per_frame)
        assert rt.session.generation == 2 and len(servers) == 2
        assert servers[0].token != servers[1].token
    finally:
        rt.close()
        for srv in servers:
            srv.close()


@pytest.mark.slow
def test_webgpu_browser_in_headless_chromium(rng: np.random.Generator) -> None:
    assert shutil.which("chromium"), "Debian chromium is not installed: apt-get install chromium"
    from quantem_flow.runtimes.external.workers import WebGpuBrowserRuntime
    from tests.npm_registry import require_web_build

    require_web_build(WebGpuBrowserRuntime.page_dir() / "index.html", what="the WebGPU page")
    ok, why = WebGpuBrowserRuntime.available()
    assert ok, why
    rt = WebGpuBrowserRuntime(hello_timeout=120)
    try:
        info = rt.start()
        assert info.runtime.startswith("webgpu")
        block = rng.integers(0, 50, size=(2, 3, 4, 5)).astype(np.uint16)
        chunk = rt.put(chunk_of("dense", block))
        out = rt.run_frame_pass(chunk, np.ones((1, 20)), want_sum=True, want_max=True)
        np.testing.assert_array_equal(out.per_frame[:, 0], block.reshape(6, 20).sum(axis=1))
        np.testing.assert_array_equal(out.pattern_sum, block.reshape(6, 20).sum(axis=0))
    finally:
        rt.close()


def test_refused_requests_do_not_spend_the_token(server: WebSocketServer) -> None:
    """Another Origin, ``Origin: null`` and a GET without an upgrade are refused, token kept."""
    import tornado.httpclient
    import tornado.websocket

    async def connect(origin: str) -> Any:
        request = tornado.httpclient.HTTPRequest(server.socket_url, headers={"Origin": origin})
        return await tornado.websocket.websocket_connect(request)

    for origin in ("http://evil.example", "null"):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            asyncio.run(connect(origin))
        assert info.value.code == 403, origin
    plain = server.socket_url.replace("ws://", "http://")
    assert _get(plain)[0] == 400  # no upgrade: refused by tornado
    assert _get(plain, {"Origin": "null", "Upgrade": "websocket", "Connection": "Upgrade"})[0] in (
        400,
        403,
    )
    # the real page still connects with the same token, once
    thread, result = _page(server.socket_url, ReferenceWorker())
    conn = server.accept(30)
    conn.send(pr.hello_request(client="t"))
    assert conn.recv(10).type == "hello"
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        asyncio.run(connect(f"http://127.0.0.1:{server.port}"))
    assert info.value.code == 403  # now spent
    conn.send(pr.bye(id=1))
    assert conn.recv(10).type == "bye"
    thread.join(10)
    assert result == {"close": None}
