"""Access to runtime instances for kernel modules (avoids import cycles)."""

from __future__ import annotations

from typing import Any

__all__ = ["cuda_runtime"]


def cuda_runtime() -> Any:
    """The process's CUDA runtime instance (raises if CUDA is unavailable)."""
    from . import get_runtime

    return get_runtime("cuda")
