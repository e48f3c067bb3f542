"""The declaration of the ``cpu`` runtime (cheap to import; the kernels load on first use)."""

from __future__ import annotations

import os
import platform

from ..dtypes import ALL_NUMERIC, INTEGERS, triples
from ..registry import ProbeResult, RuntimeSpec

__all__ = ["KERNELS", "SPEC", "probe"]

#: What the CPU runtime runs: the Numba kernels take every integer and real
#: dtype (float16 is widened to float32 exactly); ``paired`` and ``packed``
#: hold integer counts only.
KERNELS = frozenset(
    triples("frame_pass", "dense", ALL_NUMERIC)
    | triples("frame_pass", "encoded", ALL_NUMERIC)
    | triples("frame_pass", "paired", INTEGERS)
    | triples("frame_pass", "packed", INTEGERS)
    | triples("gather", "dense", ALL_NUMERIC)
    | triples("gather", "encoded", ALL_NUMERIC)
    | triples("gather", "paired", INTEGERS)
    | triples("gather", "packed", INTEGERS)
    | triples("ssb", "gathered", ALL_NUMERIC)
)


def probe(*, nthreads: int, memory_limit: int, budget_fraction: float) -> ProbeResult:
    """Always available: one slot per worker thread, a share of host memory as budget."""
    import numpy as np

    return ProbeResult(
        available=True,
        reason="always available",
        slots=float(nthreads),
        budget_bytes=int(budget_fraction * memory_limit),
        details={
            "device": platform.processor() or platform.machine(),
            "cores": os.cpu_count() or 1,
            "numpy": np.__version__,
        },
    )


SPEC = RuntimeSpec(
    name="cpu",
    factory="quantem_flow.runtimes.cpu:CpuRuntime",
    dependency=None,
    kernels=KERNELS,
    auto_rank=100,
    probe="quantem_flow.runtimes.cpu.spec:probe",
    array_ops="quantem_flow.runtimes.cpu.array_ops:NumpyOps",
    array_ops_precision="complex128",
    residency="host",
    description="host memory, NumPy layout, Numba kernels",
)
