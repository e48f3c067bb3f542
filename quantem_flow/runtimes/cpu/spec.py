"""The declaration of the ``cpu`` runtime (cheap to import; the kernels load on first use)."""

from __future__ import annotations

import os
import platform

from ..dtypes import ALL_NUMERIC, INTEGERS, triples
from ..registry import ProbeResult, RuntimeSpec

__all__ = ["FRAME_PASS_KERNELS", "KERNELS", "SPEC", "probe"]

#: One row per representation the CPU runtime runs: its frame-pass kernel
#: (``"module:function"``, imported on first use; ``None``: the runtime's own
#: dense pass) and the dtypes it takes.  The Numba kernels take every integer
#: and real dtype (float16 is widened to float32 exactly); ``paired`` and
#: ``packed`` hold integer counts only.  Gathering pixels is the
#: representation's own (``Representation.gather``), on the same dtypes.
FRAME_PASS_KERNELS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "dense": (None, ALL_NUMERIC),
    "encoded": ("quantem_flow.runtimes.cpu.encoded_kernels:frame_pass_encoded", ALL_NUMERIC),
    "paired": ("quantem_flow.runtimes.cpu.paired_kernels:frame_pass_paired", INTEGERS),
    "packed": ("quantem_flow.runtimes.cpu.packed_kernels:frame_pass_packed", INTEGERS),
}

#: What the CPU runtime runs (derived from :data:`FRAME_PASS_KERNELS`, plus the SSB stage).
KERNELS = frozenset(
    frozenset().union(
        *(
            triples("frame_pass", rep, dtypes) | triples("gather", rep, dtypes)
            for rep, (_, dtypes) in FRAME_PASS_KERNELS.items()
        )
    )
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
