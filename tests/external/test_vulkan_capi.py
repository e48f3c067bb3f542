"""The shared conformance suite on ``libqfvulkan``'s C ABI, called from Python with ctypes.

The same cases as every runtime, on both accumulator paths (int64/float64 on lavapipe, and
the forced two-word/float32 path), without the wire protocol: the library as an Android
app would link it (tests/external/vulkan_capi.py is the adapter).
"""

from __future__ import annotations

import pytest

from quantem_flow import testing
from quantem_flow.runtimes.external.spec import VULKAN_KERNELS
from quantem_flow.runtimes.registry import RuntimeSpec, register_runtime, unregister_runtime

from .vulkan_capi import VulkanCapiRuntime

_SPECS = tuple(
    RuntimeSpec(
        name=name,
        factory=f"tests.external.vulkan_capi:{cls}",
        dependency=None,
        kernels=VULKAN_KERNELS,
        auto_rank=None,
        residency="external",
        description="libqfvulkan through its C ABI (ctypes; tests)",
    )
    for name, cls in (
        ("vulkan-capi", "VulkanCapiRuntime"),
        ("vulkan-capi-u32x2", "VulkanCapiTwoWordRuntime"),
    )
)


def _register() -> None:
    for spec in _SPECS:
        register_runtime(spec, replace=True)


_register()
_CASES = testing.conformance_params([s.name for s in _SPECS])
for _spec in _SPECS:
    unregister_runtime(_spec.name)


@pytest.fixture(autouse=True, scope="module")
def _registered(_registry_restored: None) -> None:
    _register()


def test_the_library_is_built_and_reports_its_device() -> None:
    ok, why = VulkanCapiRuntime.available()
    assert ok, why
    runtime = VulkanCapiRuntime()
    info = runtime.info()
    assert info.device_name  # e.g. llvmpipe
    assert info.memory_budget_bytes > 0
    assert runtime.precision().integer in ("int64", "u32x2")


@pytest.mark.parametrize("case", _CASES)
def test_c_abi_conforms(case: object) -> None:
    testing.run_case(case)
