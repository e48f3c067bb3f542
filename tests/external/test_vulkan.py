"""The shared runtime conformance suite over the bridge against the Vulkan worker (android/).

``qf-vulkan-worker`` runs on Mesa lavapipe here, with its hello's accumulation
(``int64``/``float64`` on lavapipe); the ``vulkan-u32x2`` variant forces the
two-word integer accumulators and float32 reals that devices without
``shaderInt64``/``shaderFloat64`` use, so both paths pass the same cases.
The executable is built by ``scripts/install-toolchains.sh``; a missing
build fails (Vulkan runs on this machine kind), it does not skip.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest

from quantem_flow import testing
from quantem_flow.errors import ExternalWorkerError
from quantem_flow.representations import Chunk
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.external.vulkan import VULKAN_SPEC, VulkanRuntime
from quantem_flow.runtimes.registry import register_runtime, runtime_specs, unregister_runtime


class ForcedTwoWordVulkan(VulkanRuntime):
    """The Vulkan worker with the two-word integer / float32 path forced."""

    name: ClassVar[str] = "vulkan-u32x2"

    def command(self) -> list[str]:
        return [*super().command(), "--force-u32x2", "--force-float32"]


FORCED_SPEC = dataclasses.replace(
    VULKAN_SPEC,
    name="vulkan-u32x2",
    factory=f"{__name__}:ForcedTwoWordVulkan",
    description="qf-vulkan-worker --force-u32x2 --force-float32 (tests)",
)

SMALL_BUDGET = 131072


class SmallBudgetVulkan(VulkanRuntime):
    """The Vulkan worker with a 128 KiB payload budget."""

    name: ClassVar[str] = "vulkan-small-budget"

    def command(self) -> list[str]:
        return [*super().command(), "--budget-bytes", str(SMALL_BUDGET)]


_SPECS = (VULKAN_SPEC, FORCED_SPEC)


def _register() -> None:
    for spec in _SPECS:
        if spec.name not in runtime_specs():
            register_runtime(spec)


# The cases are made at collection; the runtimes are registered only while this module
# runs (conftest's _registry_restored removes them), so other modules never see them.
_register()
_CASES = testing.conformance_params(["vulkan", "vulkan-u32x2"])
for _spec in _SPECS:
    unregister_runtime(_spec.name)


@pytest.fixture(autouse=True, scope="module")
def _registered(_registry_restored: None) -> None:
    _register()


def test_vulkan_worker_is_built_and_answers() -> None:
    ok, why = VulkanRuntime.available()
    assert ok, why
    runtime = get_runtime("vulkan")
    hello = runtime.start()
    assert hello.runtime == "vulkan"
    assert hello.memory_budget_bytes > 0
    assert set(hello.kernels) == set(VULKAN_SPEC.kernels)
    forced = get_runtime("vulkan-u32x2").start()
    assert forced.accumulation == {"integer": "u32x2", "real": "float32"}


@pytest.mark.parametrize("case", _CASES)
def test_vulkan_worker_conforms(case: object) -> None:
    testing.run_case(case)


def test_over_budget_put_is_refused_before_allocation() -> None:
    runtime = SmallBudgetVulkan()
    try:
        assert runtime.budget_bytes == SMALL_BUDGET
        block = np.ones((1, 40, 32, 32), dtype=np.uint16)  # 80 KiB: one fits, two do not
        chunk = Chunk("dense", "host", ((0, 1), (0, 40)), block, "dense-v1")
        first = runtime.put(chunk)
        with pytest.raises(ExternalWorkerError) as err:
            runtime.put(chunk)
        assert err.value.code == "budget"
        assert "budget" in str(err.value)
        stats = runtime.stats()
        assert stats["handles"] == 1, stats  # the refused put allocated nothing
        weights = np.ones((1, 32 * 32))
        out = runtime.run_frame_pass(first, weights, want_sum=False, want_max=False)
        np.testing.assert_array_equal(out.per_frame[:, 0], np.full(40, 32.0 * 32))
        runtime.release(first)
        after = runtime.stats()
        assert after["resident_bytes"]["dense"] == 0, after  # only the cached weights remain
    finally:
        runtime.close()
