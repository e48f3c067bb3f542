"""Runtime adapters and their registry.

The manifest below says, without importing CuPy or MLX, which runtimes
exist, which (operation, representation) kernels they provide and how to
probe them.  ``backend="auto"`` picks the first available of
:data:`AUTO_ORDER`; an explicit runtime that is unavailable raises
:class:`~quantem_flow.errors.RuntimeUnavailableError` naming those that are.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from ..errors import ParameterError, RuntimeUnavailableError, UnsupportedOperationError
from .base import FramePassResult, Runtime

__all__ = [
    "AUTO_ORDER",
    "MANIFEST",
    "BackendChoice",
    "FramePassResult",
    "Runtime",
    "available_runtimes",
    "get_runtime",
    "resolve_backend",
]

#: name -> (module:class, kernels as (operation, representation) pairs)
MANIFEST: dict[str, dict[str, Any]] = {
    "cpu": {
        "class": "quantem_flow.runtimes.cpu:CpuRuntime",
        "kernels": [
            ("frame_pass", "dense"),
            ("frame_pass", "paired"),
            ("frame_pass", "packed"),
            ("frame_pass", "encoded"),
            ("ssb", "gathered"),
        ],
    },
    "cuda": {
        "class": "quantem_flow.runtimes.cuda:CudaRuntime",
        "kernels": [
            ("frame_pass", "dense"),
            ("frame_pass", "paired"),
            ("frame_pass", "packed"),
            ("frame_pass", "encoded"),
            ("ssb", "gathered"),
        ],
    },
    "mps": {
        "class": "quantem_flow.runtimes.mps:MpsRuntime",
        "kernels": [("frame_pass", "dense"), ("ssb", "gathered")],
    },
}

#: Preference of ``backend="auto"``.
AUTO_ORDER = ("cuda", "mps", "cpu")

_instances: dict[str, Runtime] = {}


def _runtime_class(name: str) -> type[Runtime]:
    entry = MANIFEST.get(name)
    if entry is None:
        raise RuntimeUnavailableError(
            f"unknown runtime {name!r}; registered runtimes: {sorted(MANIFEST)}"
        )
    module, _, cls = str(entry["class"]).partition(":")
    runtime_cls: type[Runtime] = getattr(importlib.import_module(module), cls)
    return runtime_cls


def available_runtimes() -> dict[str, str]:
    """Return ``{name: reason}`` for every registered runtime that can run here."""
    out: dict[str, str] = {}
    for name in MANIFEST:
        try:
            ok, why = _runtime_class(name).available()
        except ImportError as exc:
            ok, why = False, f"import failed: {exc}"
        if ok:
            out[name] = why
    return out


def get_runtime(name: str) -> Runtime:
    """Return the (cached) runtime instance ``name``, or raise if unavailable."""
    if name in _instances:
        return _instances[name]
    cls = _runtime_class(name)
    ok, why = cls.available()
    if not ok:
        raise RuntimeUnavailableError(
            f"runtime {name!r} is not available here ({why}); available: "
            f"{sorted(available_runtimes())}. Choose one of those or backend='auto'"
        )
    _instances[name] = cls()
    return _instances[name]


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """Which runtime a computation uses and why (recorded in provenance)."""

    requested: str
    chosen: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-ready dict."""
        return dataclasses.asdict(self)


def resolve_backend(
    backend: str, *, operation: str = "frame_pass", representation: str = "dense"
) -> BackendChoice:
    """Choose the runtime for ``backend`` ("auto", "cpu", "cuda", "mps").

    Parameters
    ----------
    backend
        ``"auto"`` or a runtime name.
    operation, representation
        The kernel the runtime must provide.

    Returns
    -------
    BackendChoice
        The requested and chosen names and the reason.

    Raises
    ------
    RuntimeUnavailableError
        An explicit runtime is not available; the message names those that are.
    UnsupportedOperationError
        An explicit runtime has no kernel for the operation on the representation.
    """
    if not isinstance(backend, str):
        raise ParameterError(f"backend must be a string, got {backend!r}")
    available = available_runtimes()
    if backend == "auto":
        not_here: list[str] = []
        passed_over: list[str] = []
        for name in AUTO_ORDER:
            if name not in available:
                not_here.append(name)
                continue
            if (operation, representation) not in {tuple(k) for k in MANIFEST[name]["kernels"]}:
                passed_over.append(f"{name} (no {operation!r} kernel on {representation!r})")
                continue
            eligible, reason = _runtime_class(name).auto_eligible()
            if not eligible:
                passed_over.append(f"{name} ({reason})")
                continue
            why = f"first available of {list(AUTO_ORDER)}"
            if not_here:
                why += f"; not available here: {not_here}"
            if passed_over:
                why += "; skipped by auto: " + "; ".join(passed_over)
            return BackendChoice("auto", name, why)
        raise RuntimeUnavailableError(
            f"no runtime here can run {operation!r} on {representation!r} by backend='auto'; "
            f"available: {sorted(available)}"
            + (f"; skipped by auto: {'; '.join(passed_over)}" if passed_over else "")
        )
    runtime = get_runtime(backend)
    if not runtime.supports(operation, representation):
        able = [
            n
            for n, e in MANIFEST.items()
            if (operation, representation) in map(tuple, e["kernels"])
        ]
        raise UnsupportedOperationError(
            f"runtime {backend!r} has no kernel for {operation!r} on the {representation!r} "
            f"representation; runtimes that do: {able}"
        )
    return BackendChoice(backend, backend, "requested explicitly")
