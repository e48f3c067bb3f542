"""The declaration of the ``mps`` runtime (imports no MLX; the probe does, when called)."""

from __future__ import annotations

from typing import Any

from ..dtypes import ALL_NUMERIC, INTEGERS, triples
from ..registry import ProbeResult, RuntimeSpec

__all__ = ["KERNELS", "SPEC", "probe"]

#: MLX holds every integer and real dtype; every representation stays
#: resident in MLX (``paired`` and ``packed`` hold integer counts only, as on
#: the CPU; ``encoded`` is decoded on the host into an MLX buffer).
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
    """MLX must import and allocate; one slot; Metal's working set or a share of host memory."""
    from . import _probe

    ok, _, why = _probe()
    if not ok:
        return ProbeResult(False, why)
    import mlx.core as mx

    metal = bool(mx.metal.is_available())
    info_fn = getattr(mx, "device_info", None) or getattr(mx.metal, "device_info", None)
    info: dict[str, Any] = {}
    if info_fn is not None:
        try:
            info = dict(info_fn())
        except Exception:  # pragma: no cover - depends on the MLX build
            info = {}
    details: dict[str, Any] = {
        "device": str(info.get("device_name", "")),
        "metal": metal,
        "mlx": str(getattr(mx, "__version__", "")),
    }
    working_set = info.get("max_recommended_working_set_size")
    if metal and working_set:  # pragma: no cover - needs Apple silicon
        details["recommended_working_set_bytes"] = int(working_set)
        budget = int(working_set)
    else:
        budget = int(budget_fraction * memory_limit)
    return ProbeResult(True, why, 1.0, budget, details)


SPEC = RuntimeSpec(
    name="mps",
    factory="quantem_flow.runtimes.mps:MpsRuntime",
    dependency="mlx.core",
    kernels=KERNELS,
    auto_rank=20,
    probe="quantem_flow.runtimes.mps.spec:probe",
    array_ops="quantem_flow.runtimes.mps.array_ops:MlxOps",
    array_ops_precision="complex64",
    residency="mps",
    description="MLX arrays: the Metal GPU on Apple silicon, MLX's CPU backend elsewhere",
    memory_pool="host",  # unified memory on Apple silicon, host RAM elsewhere
    host_copy_value_bytes=4,  # MLX copies a payload into its own float32 arrays
)
