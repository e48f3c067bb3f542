"""The ``vulkan`` runtime: the C++/Vulkan worker of ``android/`` on the host, over pipes.

``android/`` builds ``libqfvulkan`` (a C ABI) and the host executable
``qf-vulkan-worker`` that speaks ``qf-worker/1`` on stdin/stdout (``cmake -S
android -B android/build && cmake --build android/build``).  On this
project's machines it runs on Mesa lavapipe (Vulkan on the CPU): a
correctness path, not an accelerator, so ``backend="auto"`` never picks it.
The same library builds for Android (arm64-v8a, NDK), where an app hosts it.

Environment: ``$QF_VULKAN_WORKER`` (the executable), ``$QF_VULKAN_DEVICE``
(a device index or name, passed as ``--device``), ``$QF_VULKAN_ARGS`` (more
arguments, shell-split, e.g. ``--force-u32x2`` or ``--validation``).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, ClassVar

from ...errors import RuntimeUnavailableError
from .spec import VULKAN_KERNELS, VULKAN_SPEC
from .workers import PipeRuntime, external_probe

__all__ = ["VULKAN_KERNELS", "VULKAN_SPEC", "VulkanRuntime", "probe_vulkan", "vulkan_worker_path"]


def vulkan_worker_path() -> Path:
    """The ``qf-vulkan-worker`` executable (``$QF_VULKAN_WORKER`` or ``android/build/``)."""
    override = os.environ.get("QF_VULKAN_WORKER")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "android" / "build" / "qf-vulkan-worker"


class VulkanRuntime(PipeRuntime):
    """The Vulkan worker (``android/``'s host executable) in a child process."""

    name: ClassVar[str] = "vulkan"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The executable is built (the Vulkan loader and a device are checked by its hello)."""
        path = vulkan_worker_path()
        if not path.is_file():
            return False, (
                f"{path} does not exist: build the Vulkan worker with `cmake -S android -B "
                "android/build -DCMAKE_BUILD_TYPE=Release && cmake --build android/build` "
                "(or set $QF_VULKAN_WORKER)"
            )
        return True, str(path)

    def command(self) -> list[str]:
        """``qf-vulkan-worker [--device D] [$QF_VULKAN_ARGS]``."""
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailableError(f"runtime {self.name!r} is not available here: {why}")
        cmd = [str(vulkan_worker_path())]
        device = os.environ.get("QF_VULKAN_DEVICE")
        if device:
            cmd += ["--device", device]
        return cmd + shlex.split(os.environ.get("QF_VULKAN_ARGS", ""))


def probe_vulkan(*, nthreads: int, memory_limit: int, budget_fraction: float) -> Any:
    """Probe of ``vulkan``: start ``qf-vulkan-worker`` and say hello."""
    return external_probe("vulkan")
