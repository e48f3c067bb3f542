"""The ``swift`` runtime: the Swift worker of ``native/`` (``qf-swift-worker``), over pipes.

``native/`` is a SwiftPM package whose executable speaks ``qf-worker/1`` on
stdin/stdout: Metal kernels on Apple GPUs, a SIMD CPU backend everywhere else
(``swift build -c release --package-path native``; ``scripts/build-native.sh``
builds it for this machine's CPU).  On this project's Linux machines it runs
its CPU backend: a real CPU path, not an emulation, but ``backend="auto"``
never picks it (an explicit choice, like every external runtime).

Its kernels are not copied here by hand: :func:`swift_spec` asks the built
worker for its ``hello`` (``qf-swift-worker --hello``, with the same device
and arguments the runtime starts it with) and declares exactly the kernels it
announces.  Where the worker is not built the runtime is not registered, and
:func:`why_not_registered` says why and how to build it.

Environment: ``$QF_SWIFT_WORKER`` (the executable), ``$QF_SWIFT_DEVICE``
(``auto``, ``cpu`` or ``metal``, passed as ``--device``), ``$QF_SWIFT_ARGS``
(more arguments, shell-split: ``--threads 4``, ``--budget-bytes N``, or the
test hooks ``--crash-file PATH`` and ``--run-delay S``).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar

from ...errors import ParameterError, RuntimeUnavailableError
from .workers import PipeRuntime, external_probe

__all__ = [
    "SwiftRuntime",
    "native_dir",
    "probe_swift",
    "swift_hello",
    "swift_spec",
    "swift_worker_path",
    "why_not_built",
]

#: Seconds ``qf-swift-worker --hello`` may take (it starts the backend: Metal compiles its
#: kernels from source, the CPU backend starts at once).
HELLO_TIMEOUT_S = 60.0


def native_dir() -> Path:
    """The ``native/`` Swift package of this checkout."""
    return Path(__file__).resolve().parents[3] / "native"


def swift_worker_path() -> Path:
    """The ``qf-swift-worker`` executable (``$QF_SWIFT_WORKER`` or ``native/.build/release/``)."""
    override = os.environ.get("QF_SWIFT_WORKER")
    if override:
        return Path(override)
    return native_dir() / ".build" / "release" / "qf-swift-worker"


def worker_arguments() -> list[str]:
    """Arguments the runtime passes: ``--device $QF_SWIFT_DEVICE`` and ``$QF_SWIFT_ARGS``."""
    args = []
    device = os.environ.get("QF_SWIFT_DEVICE")
    if device:
        args += ["--device", device]
    return args + shlex.split(os.environ.get("QF_SWIFT_ARGS", ""))


def why_not_built() -> str | None:
    """Why the worker cannot run here (``None`` when its executable exists)."""
    path = swift_worker_path()
    if path.is_file():
        return None
    how = (
        "build it with `bash scripts/build-native.sh` (swift build -c release in native/), or "
        "set $QF_SWIFT_WORKER"
    )
    if shutil.which("swift") is None and "QF_SWIFT_WORKER" not in os.environ:
        how = (
            "the Swift toolchain is not installed: install Swift 6 (swift.org/install, or "
            "Xcode on macOS), then " + how
        )
    return f"{path} does not exist: {how}"


def swift_hello(args: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The worker's ``hello`` header, from ``qf-swift-worker --hello`` (cached per build).

    Raises
    ------
    RuntimeUnavailableError
        The worker is not built, or it did not start (the message carries its stderr).
    """
    why = why_not_built()
    if why is not None:
        raise RuntimeUnavailableError(f"runtime 'swift' is not available here: {why}")
    path = swift_worker_path()
    stat = path.stat()
    return _hello(str(path), stat.st_mtime_ns, stat.st_size, args or tuple(worker_arguments()))


@functools.cache
def _hello(path: str, mtime_ns: int, size: int, args: tuple[str, ...]) -> dict[str, Any]:
    try:
        run = subprocess.run(
            [path, *args, "--hello"],
            capture_output=True,
            timeout=HELLO_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeUnavailableError(
            f"runtime 'swift': `{path} --hello` did not answer: {exc}"
        ) from exc
    if run.returncode != 0:
        raise RuntimeUnavailableError(
            f"runtime 'swift': `{path} {' '.join(args)} --hello` exited {run.returncode}: "
            f"{run.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    try:
        hello: dict[str, Any] = json.loads(run.stdout)
    except ValueError as exc:
        raise RuntimeUnavailableError(
            f"runtime 'swift': `{path} --hello` printed no JSON hello ({exc}): {run.stdout[:200]!r}"
        ) from exc
    return hello


def swift_spec() -> Any:
    """The ``RuntimeSpec`` of ``swift``, its kernels those the built worker's hello declares.

    Raises
    ------
    RuntimeUnavailableError
        The worker is not built or does not start (the message says how to build it).
    """
    from ..registry import RuntimeSpec

    hello = swift_hello()
    try:
        kernels = frozenset(tuple(k) for k in hello["kernels"])
        device = hello["device"]
        description = (
            f"Swift worker (native/) over pipes (qf-worker/1): {device['backend']} backend on "
            f"{device['name']}, accumulation {hello['accumulation']}"
        )
        return RuntimeSpec(
            name="swift",
            factory="quantem_flow.runtimes.external.swift:SwiftRuntime",
            dependency=None,
            kernels=kernels,
            auto_rank=None,
            probe="quantem_flow.runtimes.external.swift:probe_swift",
            residency="external",
            description=description,
        )
    except (KeyError, TypeError, ParameterError) as exc:
        raise RuntimeUnavailableError(
            f"runtime 'swift': the worker's hello does not declare kernels the registry "
            f"accepts ({type(exc).__name__}: {exc}); hello: {hello!r:.500}"
        ) from exc


class SwiftRuntime(PipeRuntime):
    """The Swift worker (``native/``'s ``qf-swift-worker``) in a child process."""

    name: ClassVar[str] = "swift"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The executable is built (the backend is checked by its hello)."""
        why = why_not_built()
        if why is not None:
            return False, why
        return True, str(swift_worker_path())

    def command(self) -> list[str]:
        """``qf-swift-worker [--device D] [$QF_SWIFT_ARGS]``."""
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailableError(f"runtime {self.name!r} is not available here: {why}")
        return [str(swift_worker_path()), *worker_arguments()]


def probe_swift(*, nthreads: int, memory_limit: int, budget_fraction: float) -> Any:
    """Probe of ``swift``: start ``qf-swift-worker`` and say hello."""
    return external_probe("swift")
