"""``scripts/build-web.sh`` and the web/ tests' skip, both ways: npm registry closed and answering.

A closed loopback port stands for a machine without the npm registry (a refusal
comes at once): the script says ``web/ is not built: the npm registry cannot be
reached`` and succeeds, and a web/ test skips with that reason.  A loopback
registry that answers ``npm ping`` but has no packages stands for a registry
that answers: then a failed ``npm ci`` fails the script, and a missing build
fails the test.  The script runs on a copy of ``web/package*.json`` so the real
``web/node_modules`` is never touched.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from tests.npm_registry import ROOT, WEB, npm_registry_answers, require_web_build

pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None, reason="npm is not installed (Node.js 20 with npm)"
)

SCRIPT = ROOT / "scripts" / "build-web.sh"
MESSAGE = "web/ is not built: the npm registry cannot be reached"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PingOnly(http.server.BaseHTTPRequestHandler):
    """A registry that answers ``npm ping`` and has no packages."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = b"{}"
        self.send_response(200 if self.path.startswith("/-/ping") else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def answering_registry() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PingOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def web_copy(tmp_path: Path) -> Path:
    web = tmp_path / "web"
    web.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(WEB / name, web / name)
    return web


def _script(web: Path, registry: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "npm_config_registry": registry, "npm_config_fetch_retries": "0"}
    start = time.monotonic()
    run = subprocess.run(
        ["bash", str(SCRIPT), str(web)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    return run, time.monotonic() - start


def test_closed_registry_is_said_and_the_set_up_goes_on(web_copy: Path) -> None:
    registry = f"http://127.0.0.1:{_closed_port()}/"
    run, seconds = _script(web_copy, registry)
    assert run.returncode == 0, run.stdout + run.stderr
    assert MESSAGE in run.stdout, run.stdout + run.stderr
    assert registry in run.stdout  # which registry was asked
    assert not (web_copy / "node_modules").exists()
    assert seconds < 20, f"a refused registry took {seconds:.1f} s to notice"
    assert npm_registry_answers(registry)[0] is False


def test_answering_registry_makes_a_failed_install_fail(
    web_copy: Path, answering_registry: str
) -> None:
    assert npm_registry_answers(answering_registry)[0] is True
    run, _ = _script(web_copy, answering_registry)
    assert run.returncode != 0, run.stdout + run.stderr
    assert MESSAGE not in run.stdout
    assert "npm ci" in run.stdout
    assert any(p.startswith("/-/ping") for p in _PingOnly.seen)


def test_a_missing_build_skips_only_where_the_registry_cannot_be_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answering_registry: str
) -> None:
    missing = tmp_path / "dist" / "node-worker.js"
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{_closed_port()}/")
    with pytest.raises(pytest.skip.Exception, match=MESSAGE):
        require_web_build(missing)
    monkeypatch.setenv("npm_config_registry", answering_registry)
    with pytest.raises(pytest.fail.Exception, match="install-toolchains"):
        require_web_build(missing)
    missing.parent.mkdir()
    missing.write_text("built")
    require_web_build(missing)  # a build that is there is used, whatever the registry says
