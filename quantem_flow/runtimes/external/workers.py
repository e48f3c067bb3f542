"""The external runtimes quantem-flow knows: WebGPU (Node + Dawn, or a browser) and the reference.

* ``webgpu``: ``node web/dist/node-worker.js`` over pipes (Dawn on OpenGL ES
  here: ``EGL_PLATFORM=surfaceless``).  Build it with ``cd web && npm ci &&
  npm run build``.  ``$QF_WEBGPU_WORKER`` overrides the script path and
  ``$QF_NODE`` the Node binary.
* ``webgpu-browser``: a token-guarded WebSocket on 127.0.0.1 serving
  ``web/dist/browser``; headless Chromium is launched on it, unless
  ``$QF_WEBGPU_BROWSER_LAUNCH=0`` (or ``quantem-flow worker --no-launch``),
  in which case the URL is printed for a person to open in their own browser.
* ``external-reference``: the NumPy reference worker
  (:mod:`.reference_worker`) as a child process; registered by tests and
  by :func:`register_reference_runtime`.

Each runtime is declared with a :class:`~quantem_flow.runtimes.registry.RuntimeSpec`
(:func:`external_specs`); the probe starts the worker once per process,
says ``hello`` and reports one slot and the worker's memory budget.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ...errors import ExternalWorkerError, RuntimeUnavailableError
from .bridge import ExternalRuntime
from .protocol import DTYPES
from .transport import (
    ChromiumProcess,
    Connection,
    PipeConnection,
    WebSocketConnection,
    WebSocketServer,
    launch_chromium,
)

__all__ = [
    "PipeRuntime",
    "ReferenceRuntime",
    "WebGpuBrowserRuntime",
    "WebGpuNodeRuntime",
    "external_probe",
    "external_specs",
    "probe_reference",
    "probe_webgpu",
    "probe_webgpu_browser",
    "reference_runtime_spec",
    "register_reference_runtime",
    "web_dist",
]

_INTEGER = tuple(d for d in DTYPES if d.startswith(("uint", "int")))


def web_dist() -> Path:
    """The ``web/dist`` directory of this checkout (where ``npm run build`` writes)."""
    return Path(__file__).resolve().parents[3] / "web" / "dist"


class PipeRuntime(ExternalRuntime):
    """An external runtime whose worker is a child process speaking over stdin/stdout."""

    name: ClassVar[str] = "external-pipe"

    def command(self) -> list[str]:
        """The worker's command line."""
        raise RuntimeUnavailableError(f"external runtime {self.name!r} defines no command")

    def environment(self) -> dict[str, str]:
        """Extra environment variables of the worker process."""
        return {}

    def connect(self) -> Connection:
        """Start the worker process."""
        return PipeConnection(self.command(), name=self.name, env=self.environment())


class ReferenceRuntime(PipeRuntime):
    """The NumPy reference worker in a child process (tests, and a template for new workers)."""

    name: ClassVar[str] = "external-reference"
    #: Memory budget given to the worker (``--budget-bytes``).
    budget: ClassVar[int] = 1 << 30
    #: More command-line arguments (test hooks such as ``--crash-file``).
    extra_args: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Always: it needs only this Python."""
        return True, f"reference worker on {sys.executable}"

    def command(self) -> list[str]:
        """``python -m quantem_flow.runtimes.external.reference_worker ...``.

        ``$QF_REFERENCE_WORKER_BUDGET`` overrides the budget and
        ``$QF_REFERENCE_WORKER_ARGS`` adds arguments (shell-split), so a worker
        process started elsewhere (a cluster) can be configured.
        """
        import shlex

        budget = os.environ.get("QF_REFERENCE_WORKER_BUDGET", str(self.budget))
        extra = shlex.split(os.environ.get("QF_REFERENCE_WORKER_ARGS", ""))
        return [
            sys.executable,
            "-m",
            "quantem_flow.runtimes.external.reference_worker",
            "--budget-bytes",
            budget,
            "--runtime",
            self.name,
            *self.extra_args,
            *extra,
        ]


def _node() -> str | None:
    return os.environ.get("QF_NODE") or shutil.which("node")


def _node_worker_script() -> Path:
    override = os.environ.get("QF_WEBGPU_WORKER")
    return Path(override) if override else web_dist() / "node-worker.js"


class WebGpuNodeRuntime(PipeRuntime):
    """The WebGPU worker (``web/``) on Node with Dawn, over pipes."""

    name: ClassVar[str] = "webgpu"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Node is on PATH and ``web/dist/node-worker.js`` is built."""
        node = _node()
        if node is None:
            return False, "node is not on PATH (install Node >= 20, or set $QF_NODE)"
        script = _node_worker_script()
        if not script.is_file():
            return False, (
                f"{script} does not exist: build the WebGPU worker with "
                f"`cd {script.parents[1]} && npm ci && npm run build` (or set $QF_WEBGPU_WORKER)"
            )
        return True, f"{node} {script}"

    def command(self) -> list[str]:
        """``node web/dist/node-worker.js``."""
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailableError(f"runtime {self.name!r} is not available here: {why}")
        node = _node()
        assert node is not None
        return [node, str(_node_worker_script())]

    def environment(self) -> dict[str, str]:
        """Dawn's OpenGL ES backend needs a surfaceless EGL platform on headless Linux."""
        return {"EGL_PLATFORM": os.environ.get("EGL_PLATFORM", "surfaceless")}


class _BrowserConnection:
    """A page's WebSocket plus the server (and browser) that exist for it."""

    def __init__(
        self, conn: WebSocketConnection, server: WebSocketServer, browser: ChromiumProcess | None
    ) -> None:
        self.name = conn.name
        self._conn = conn
        self.server = server
        self.browser = browser

    @property
    def alive(self) -> bool:
        return self._conn.alive

    @property
    def pid(self) -> int | None:
        return None if self.browser is None else self.browser.pid

    def send(
        self, message: Any, *, timeout: float | None = None, handle: int | None = None
    ) -> None:
        self._conn.send(message, timeout=timeout, handle=handle)

    def recv(
        self, timeout: float, *, message_type: str | None = None, handle: int | None = None
    ) -> Any:
        return self._conn.recv(timeout, message_type=message_type, handle=handle)

    def close(self, *, timeout: float = 5.0) -> None:
        self._conn.close(timeout=timeout)
        self.server.close()
        if self.browser is not None:
            self.browser.close()


class WebGpuBrowserRuntime(ExternalRuntime):
    """The WebGPU worker in a browser page, over a loopback WebSocket with a one-time token.

    Headless Chromium is launched on the page unless :attr:`launch` is false
    (``$QF_WEBGPU_BROWSER_LAUNCH=0``); then the URL is printed (stderr and
    the log) for a person to open, and the bridge waits :attr:`accept_timeout`
    seconds for the page.
    """

    name: ClassVar[str] = "webgpu-browser"
    #: Seconds to wait for the page to connect.
    accept_timeout: ClassVar[float] = float(os.environ.get("QF_WEBGPU_BROWSER_WAIT", "120"))

    @property
    def launch(self) -> bool:
        """Whether a headless Chromium is started on the page."""
        return os.environ.get("QF_WEBGPU_BROWSER_LAUNCH", "1") not in ("0", "false", "no")

    @staticmethod
    def page_dir() -> Path:
        """The page (``web/dist/browser``)."""
        override = os.environ.get("QF_WEBGPU_PAGE")
        return Path(override) if override else web_dist() / "browser"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The page is built (a browser is found at start, or a person opens the URL)."""
        page = cls.page_dir() / "index.html"
        if not page.is_file():
            return False, (
                f"{page} does not exist: build the WebGPU worker with "
                f"`cd {web_dist().parent} && npm ci && npm run build`"
            )
        return True, f"page {page.parent}"

    def connect(self) -> Connection:
        """Serve the page, launch (or announce) the browser, wait for the socket."""
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailableError(f"runtime {self.name!r} is not available here: {why}")
        server = WebSocketServer(name=self.name, page_dir=self.page_dir())
        browser = None
        try:
            if self.launch:
                browser = launch_chromium(server.url)
            else:
                print(
                    f"quantem-flow: open {server.url} in a browser with WebGPU to lend its GPU "
                    f"(runtime {self.name!r}; waiting {self.accept_timeout:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            self.last_url = server.url
            conn = server.accept(self.accept_timeout)
        except BaseException:
            if browser is not None:
                browser.close()
            server.close()
            raise
        return _BrowserConnection(conn, server, browser)


# ============================================================================ declarations


def external_probe(name: str, *, budget_fraction: float = 1.0) -> Any:
    """Start runtime ``name``'s worker (once per process), say hello, and report it.

    The worker's ``memory_budget_bytes`` is already its admission limit, so
    the probes pass it on unscaled (``budget_fraction=1``); the host's
    ``budget_fraction`` concerns host memory, not the worker's.

    Returns
    -------
    ProbeResult
        Available with one slot and the worker's ``memory_budget_bytes``
        (times ``budget_fraction``), and the hello as details; or not
        available with the reason (the program is missing, the worker
        failed to start, the handshake failed).
    """
    from .. import get_runtime
    from ..registry import ProbeResult

    try:
        runtime = get_runtime(name)
    except RuntimeUnavailableError as exc:
        return ProbeResult(False, str(exc))
    if not isinstance(runtime, ExternalRuntime):
        return ProbeResult(False, f"runtime {name!r} is not an external runtime")
    try:
        info = runtime.start()
    except (ExternalWorkerError, RuntimeUnavailableError, OSError, ValueError) as exc:
        return ProbeResult(False, f"the worker of {name!r} did not start: {exc}")
    budget = int(info.memory_budget_bytes * min(1.0, max(0.0, budget_fraction)))
    return ProbeResult(
        True,
        f"{info.implementation} on {info.device.get('name', '?')}",
        slots=1,
        budget_bytes=budget,
        details={"hello": info.to_dict(), **runtime.describe()},
    )


def probe_webgpu(*, nthreads: int, memory_limit: int, budget_fraction: float) -> Any:
    """Probe of ``webgpu``: start ``node web/dist/node-worker.js`` and say hello."""
    return external_probe("webgpu")


def probe_reference(*, nthreads: int, memory_limit: int, budget_fraction: float) -> Any:
    """Probe of ``external-reference``: start the reference worker and say hello."""
    return external_probe("external-reference")


def probe_webgpu_browser(*, nthreads: int, memory_limit: int, budget_fraction: float) -> Any:
    """Probe of ``webgpu-browser``: serve the page, open it, and say hello."""
    return external_probe("webgpu-browser")


def external_specs() -> list[Any]:
    """Return the ``RuntimeSpec`` declarations of ``webgpu`` and ``webgpu-browser``."""
    from .spec import WEBGPU_BROWSER_SPEC, WEBGPU_SPEC

    return [WEBGPU_SPEC, WEBGPU_BROWSER_SPEC]


def _attr_name(name: str) -> str:
    return "_runtime_" + name.replace("-", "_")


def reference_runtime_spec(
    name: str = "external-reference",
    *,
    budget_bytes: int = 1 << 30,
    extra_args: Sequence[str] = (),
) -> Any:
    """Declare a reference-worker runtime called ``name`` (in this process).

    A subclass of :class:`ReferenceRuntime` with that name, budget and
    extra arguments is made and published in this module, so the returned
    spec's ``factory`` and ``probe`` strings resolve here.

    Returns
    -------
    RuntimeSpec
        Pass it to :func:`~quantem_flow.runtimes.registry.register_runtime`.
    """
    from ..registry import RuntimeSpec
    from .spec import kernel_triples

    module = sys.modules[__name__]
    cls_name = _attr_name(name)
    cls = type(
        cls_name,
        (ReferenceRuntime,),
        {"name": name, "budget": int(budget_bytes), "extra_args": tuple(extra_args)},
    )
    setattr(module, cls_name, cls)

    def probe(*, nthreads: int, memory_limit: int, budget_fraction: float) -> Any:
        return external_probe(name)

    setattr(module, cls_name + "_probe", probe)
    integer = _INTEGER
    return RuntimeSpec(
        name=name,
        factory=f"{__name__}:{cls_name}",
        dependency=None,
        kernels=kernel_triples(tuple(DTYPES), tuple(integer)),
        auto_rank=None,
        probe=f"{__name__}:{cls_name}_probe",
        residency="external",
        description="the NumPy reference qf-worker/1 worker in a child process",
    )


def register_reference_runtime(
    name: str = "external-reference",
    *,
    budget_bytes: int = 1 << 30,
    extra_args: Sequence[str] = (),
    replace: bool = True,
) -> Any:
    """Declare and register a reference-worker runtime; return its spec."""
    from ..registry import register_runtime

    spec = reference_runtime_spec(name, budget_bytes=budget_bytes, extra_args=extra_args)
    register_runtime(spec, replace=replace)
    return spec
