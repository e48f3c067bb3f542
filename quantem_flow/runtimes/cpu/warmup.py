"""Which compiled CPU kernels this process has ready, and compiling the others in the background.

A kernel specialisation (the structured group loop of one mode, the fused
kernel, for one dtype) is *ready* once it ran in this process: compiled, or
loaded from Numba's disk cache.  The first pass that needs one that is not
ready starts a thread that runs the same pass on four zero frames (which
compiles or loads exactly that specialisation) and, where the pass has an
exact NumPy form (:mod:`~quantem_flow.runtimes.cpu.exact_numpy`), runs that
meanwhile instead of waiting.  ``qf.config.set(jit_in_background=False)``
makes every pass wait for its compiled kernel, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["is_ready", "mark_ready", "start", "wait", "warming"]

logger = logging.getLogger("quantem_flow.cpu.warmup")

_lock = threading.Lock()
_ready: set[Hashable] = set()
_threads: dict[Hashable, threading.Thread] = {}
#: Seconds each background warm-up took, and its error if it failed.
history: dict[Hashable, dict[str, object]] = {}


def is_ready(key: Hashable) -> bool:
    """Whether the specialisation ``key`` ran in this process."""
    return key in _ready


def mark_ready(key: Hashable) -> None:
    """Record that ``key`` ran (compiled or loaded)."""
    with _lock:
        _ready.add(key)


def warming(key: Hashable) -> bool:
    """Whether a background warm-up of ``key`` is running."""
    t = _threads.get(key)
    return t is not None and t.is_alive()


def any_warming() -> bool:
    """Whether a kernel is compiling in a background thread of this process now."""
    with _lock:
        return any(t.is_alive() for t in _threads.values())


def start(key: Hashable, warm: Callable[[], None]) -> None:
    """Run ``warm`` (which compiles ``key``) in a daemon thread, once per process and key."""
    with _lock:
        if key in _ready or key in _threads:
            return

        def run() -> None:
            t0 = time.perf_counter()
            try:
                warm()
            except Exception as exc:  # the next pass compiles in the foreground and raises there
                history[key] = {"seconds": time.perf_counter() - t0, "error": repr(exc)}
                logger.warning("quantem-flow: background compile of %s failed: %r", key, exc)
                with _lock:
                    _threads.pop(key, None)
                return
            history[key] = {"seconds": time.perf_counter() - t0}
            mark_ready(key)

        thread = threading.Thread(target=run, name=f"qf-jit-{key}", daemon=True)
        _threads[key] = thread
    thread.start()


def wait(key: Hashable, timeout_s: float | None = None) -> bool:
    """Wait for a background warm-up of ``key``; whether ``key`` is ready."""
    t = _threads.get(key)
    if t is not None:
        t.join(timeout_s)
    return is_ready(key)
