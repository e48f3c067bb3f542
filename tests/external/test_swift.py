"""The shared runtime conformance suite over the bridge against the Swift worker (native/).

``qf-swift-worker`` runs its CPU backend here (Linux has no Metal): SIMD float64 lanes,
exact int64 sums.  Its kernels are declared from its own ``hello`` (no table in Python),
and the suite runs every triple it declares.  The executable is built by
``scripts/install-toolchains.sh`` (``scripts/build-native.sh``); where Swift is installed
a missing build fails, and where it is not the tests skip naming how to install it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import ClassVar

import numpy as np
import pytest

from quantem_flow import testing
from quantem_flow.errors import ExternalWorkerError, RuntimeUnavailableError
from quantem_flow.representations import Chunk
from quantem_flow.runtimes import get_runtime, get_spec
from quantem_flow.runtimes.external.spec import register_requested
from quantem_flow.runtimes.external.swift import SwiftRuntime, swift_hello, swift_worker_path
from quantem_flow.runtimes.registry import runtime_specs, unregister_runtime
from tests.swift_toolchain import require_swift_build

# The cases are made at collection from the worker's hello; the runtime is registered only
# while this module runs (conftest's _registry_restored removes it).
register_requested(["swift"])
_CASES = testing.conformance_params(["swift"]) if "swift" in runtime_specs() else []
unregister_runtime("swift")

SMALL_BUDGET = 131072
#: How each backend of the Swift worker sums (its hello says so).
ACCUMULATION = {
    "cpu-simd": {"integer": "int64", "real": "float64"},
    "metal": {"integer": "u32x2", "real": "float32"},
}


class SmallBudgetSwift(SwiftRuntime):
    """The Swift worker with a 128 KiB payload budget."""

    name: ClassVar[str] = "swift-small-budget"

    def command(self) -> list[str]:
        return [*super().command(), "--budget-bytes", str(SMALL_BUDGET)]


@pytest.fixture(autouse=True, scope="module")
def _registered(_registry_restored: None) -> None:
    register_requested(["swift"])


def test_swift_worker_is_built_and_declares_its_kernels_from_hello() -> None:
    require_swift_build()
    ok, why = SwiftRuntime.available()
    assert ok, why
    hello = get_runtime("swift").start()
    assert hello.runtime == "swift"
    assert hello.memory_budget_bytes > 0
    if sys.platform != "darwin":
        assert hello.device["backend"] == "cpu-simd"  # Linux: the CPU backend, said so
    assert hello.accumulation == ACCUMULATION[hello.device["backend"]]
    # the declaration is the hello's, not a copy: same set, and the conformance cases cover it
    assert set(hello.kernels) == set(get_spec("swift").kernels)
    assert {
        (c.values[0].operation, c.values[0].representation, c.values[0].dtype) for c in _CASES
    } == set(hello.kernels)
    assert {op for op, _, _ in hello.kernels} == {"frame_pass", "gather"}
    assert {rep for _, rep, _ in hello.kernels} == {"dense", "paired", "packed"}
    assert swift_hello()["kernels"] == [list(k) for k in hello.kernels]


@pytest.mark.parametrize("case", _CASES)
def test_swift_worker_conforms(case: object) -> None:
    testing.run_case(case, skip_unavailable=False)


def test_over_budget_put_is_refused_before_allocation() -> None:
    require_swift_build()
    runtime = SmallBudgetSwift()
    try:
        assert runtime.budget_bytes == SMALL_BUDGET
        block = np.ones((1, 40, 32, 32), dtype=np.uint16)  # 80 KiB: one fits, two do not
        chunk = Chunk("dense", "host", ((0, 1), (0, 40)), block, "dense-v1")
        first = runtime.put(chunk)
        with pytest.raises(ExternalWorkerError) as err:
            runtime.put(chunk)
        assert err.value.code == "budget"
        assert "budget" in str(err.value) and "nothing was allocated" in str(err.value)
        stats = runtime.stats()
        assert stats["handles"] == 1, stats  # the refused put allocated nothing
        out = runtime.run_frame_pass(first, np.ones((1, 32 * 32)), want_sum=False, want_max=False)
        np.testing.assert_array_equal(out.per_frame[:, 0], np.full(40, 32.0 * 32))
        runtime.release(first)
        assert runtime.stats()["resident_bytes"]["dense"] == 0
    finally:
        runtime.close()


def test_an_explicit_metal_backend_is_refused_here_with_the_reason() -> None:
    require_swift_build()
    run = subprocess.run(
        [str(swift_worker_path()), "--device", "metal", "--hello"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert "Metal" in run.stderr and "Apple" in run.stderr, run.stderr
    assert run.stdout == ""  # stdout carries frames (or the hello) only


def test_without_the_build_swift_is_not_registered_and_says_how_to_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from quantem_flow.runtimes.registry import unregistered_reason

    unregister_runtime("swift")
    monkeypatch.setenv("QF_SWIFT_WORKER", str(tmp_path) + "/qf-swift-worker-missing")
    assert register_requested(["swift"]) == []
    why = unregistered_reason("swift")
    assert why is not None and "does not exist" in why and "build-native.sh" in why
    with pytest.raises(RuntimeUnavailableError, match=r"build-native\.sh"):
        get_spec("swift")
    monkeypatch.delenv("QF_SWIFT_WORKER")
    if shutil.which("swift") is not None:
        assert register_requested(["swift"]) == ["swift"]
        assert unregistered_reason("swift") is None


def test_quantem_flow_worker_runtime_swift(capsys: pytest.CaptureFixture[str]) -> None:
    from quantem_flow.cli import main

    require_swift_build()
    assert main(["worker", "tcp://127.0.0.1:8786", "--runtime", "swift", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--qf-runtimes swift" in out and "--host 127.0.0.1" in out


def test_backend_swift_computes_in_one_process(rng: np.random.Generator) -> None:
    import quantem_flow as qf
    from tests.conftest import probe_data

    require_swift_build()
    ds = qf.open(probe_data(rng, scan=(6, 5)), chunk_rows=2)
    queries = [qf.virtual_bf(ds, radius=4.5, center=(8.6, 14.2)), qf.center_of_mass(ds)]
    got = qf.compute(*queries, client="synchronous", backend="swift")
    ref = qf.compute(*queries, client="synchronous", backend="cpu")
    np.testing.assert_array_equal(got[0].data, ref[0].data)
    np.testing.assert_allclose(got[1].data, ref[1].data, rtol=1e-12)
    assert {r["runtime"] for r in got[0].provenance.execution["chunks"]} == {"swift"}
