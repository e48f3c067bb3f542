"""Moved: the SSB array adapters and their contract (kept so existing imports keep working).

The contract is :mod:`quantem_flow.runtimes.array_ops` (``ArrayOps``,
``Aberrations``, ``PartialSums``, ``make_ops``, ``prewarm``,
``resolve_ssb_backend``); each runtime's adapter lives in its folder
(``runtimes/cpu/array_ops.py``: ``NumpyOps``; ``cuda/``: ``CupyOps``;
``mps/``: ``MlxOps``); the physics of the stage (``chi``, ``QGrid``,
``spectra``, ``accumulate``, ``assemble``) is
:mod:`quantem_flow.operators.ssb.stages`, a layer above this one.  Names are
looked up on first use, so importing this module loads no device library.
"""

from __future__ import annotations

import importlib
from typing import Any

_MOVED = {
    "Aberrations": "quantem_flow.runtimes.array_ops",
    "ArrayOps": "quantem_flow.runtimes.array_ops",
    "PartialSums": "quantem_flow.runtimes.array_ops",
    "make_ops": "quantem_flow.runtimes.array_ops",
    "prewarm": "quantem_flow.runtimes.array_ops",
    "resolve_ssb_backend": "quantem_flow.runtimes.array_ops",
    "NumpyOps": "quantem_flow.runtimes.cpu.array_ops",
    "SPECTRA_SUB_BLOCK": "quantem_flow.runtimes.cpu.array_ops",
    "CupyOps": "quantem_flow.runtimes.cuda.array_ops",
    "MlxOps": "quantem_flow.runtimes.mps.array_ops",
}
_STAGE = ("ELEMENTWISE_ELEMENTS", "QGrid", "accumulate", "assemble", "chi", "spectra")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    if name in _STAGE:
        raise AttributeError(
            f"{name} moved to quantem_flow.operators.ssb.stages (the SSB stage's physics, "
            "a layer above the runtimes): import it from there"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
