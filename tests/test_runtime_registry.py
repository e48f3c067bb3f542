"""The runtime registry: declarations, derived views, entry points, dtype-aware resolution."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow import runtimes as rt
from quantem_flow.errors import (
    ParameterError,
    RuntimeUnavailableError,
    UnsupportedOperationError,
)
from quantem_flow.graphs.annotations import validate_annotations
from quantem_flow.graphs.worker import probe_capabilities, probe_runtime_details
from quantem_flow.graphs.worker_data import device_modules
from quantem_flow.runtimes.array_ops import resolve_ssb_backend
from quantem_flow.runtimes.registry import (
    ENTRY_POINT_GROUP,
    ProbeResult,
    RuntimeRegistryWarning,
    RuntimeSpec,
    auto_order,
    clear_registry_cache,
    entry_point_errors,
    get_spec,
    manifest,
    probe_runtime,
    register_runtime,
    runtime_specs,
    unregister_runtime,
)
from tests.conftest import probe_data

ROOT = Path(__file__).resolve().parents[1]


def test_builtins_are_declared_once_and_everything_is_derived() -> None:
    specs = runtime_specs()
    assert list(specs)[:3] == ["cpu", "cuda", "mps"]
    assert auto_order()[:3] == ("cuda", "mps", "cpu")
    assert auto_order() == rt.AUTO_ORDER
    assert set(rt.MANIFEST) == set(specs)
    assert rt.MANIFEST["cuda"]["dependency"] == "cupy"
    assert sorted(map(tuple, rt.MANIFEST["cpu"]["kernels"])) == sorted(specs["cpu"].kernels)
    assert device_modules() == ("cupy", "mlx")
    # the runtime classes read their kernels from the declaration: one source
    cpu = rt.get_runtime("cpu")
    assert cpu.kernels is specs["cpu"].kernels
    assert cpu.supports("frame_pass", "paired", np.dtype(">u2"))
    assert not cpu.supports("frame_pass", "paired", "float32")
    assert specs["cuda"].dtypes("frame_pass", "packed") == (
        "int16",
        "int32",
        "uint16",
        "uint32",
        "uint8",
    )
    assert specs["mps"].operations() == {
        *(
            (op, rep)
            for op in ("frame_pass", "gather")
            for rep in ("dense", "encoded", "paired", "packed")
        ),
        ("ssb", "gathered"),
    }


def test_listing_imports_neither_cupy_nor_mlx() -> None:
    code = (
        "import sys\n"
        "import quantem_flow.runtimes as r\n"
        "specs = r.runtime_specs(); m = r.manifest(); o = r.auto_order()\n"
        "r.resolve_backend('cpu', representation='paired', dtype='uint16')\n"
        "assert 'cuda' in specs and 'mps' in specs, specs\n"
        "bad = [m for m in ('cupy', 'mlx', 'mlx.core') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"name": "Bad Name"}, "lower case"),
        ({"name": "auto"}, "reserved"),
        ({"factory": "no_colon"}, "module:attribute"),
        ({"kernels": frozenset({("frame_pass", "dense")})}, r"dtype\) tuple"),
        ({"kernels": frozenset({("frame_pass", "dense", "u2")})}, "write 'uint16'"),
        ({"kernels": frozenset({("frame_pass", "dense", "banana")})}, "dtype name"),
        ({"auto_rank": True}, "auto_rank"),
        ({"residency": "cuda:0"}, "residency prefix"),
        ({"array_ops": "m:C"}, "array_ops_precision"),
        ({"kernels": frozenset({("ssb", "gathered", "uint16")})}, "array_ops"),
        ({"probe": "not a target"}, "probe"),
        ({"memory_pool": "Host RAM"}, "memory_pool"),
        ({"host_copy_value_bytes": 0}, "host_copy_value_bytes"),
        ({"host_copy_value_bytes": True}, "host_copy_value_bytes"),
    ],
)
def test_bad_declarations_are_refused(changes: dict[str, Any], match: str) -> None:
    fields: dict[str, Any] = {
        "name": "x",
        "factory": "m:C",
        "dependency": None,
        "kernels": frozenset({("frame_pass", "dense", "uint16")}),
        **changes,
    }
    with pytest.raises(ParameterError, match=match):
        RuntimeSpec(**fields)


def test_probe_results_are_checked() -> None:
    with pytest.raises(ParameterError, match="slots > 0"):
        ProbeResult(True, "here", 0, 10)
    with pytest.raises(ParameterError, match="budget_bytes"):
        ProbeResult(True, "here", 1, -1)
    assert ProbeResult(False, "absent").slots == 0.0


class _Toy(rt.Runtime):
    """A host runtime of no interest beyond the registry."""

    name = "toy"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, "toy"

    def frame_pass(self, frames: Any, weights: Any, *, want_sum: bool, want_max: bool) -> Any:
        raise AssertionError("not run")


def _boom(**_: Any) -> ProbeResult:
    raise OSError("no such device node")


@pytest.fixture
def toy() -> Iterator[RuntimeSpec]:
    spec = RuntimeSpec(
        name="toy",
        factory=f"{__name__}:_Toy",
        dependency=None,
        kernels=frozenset({("frame_pass", "dense", "uint16")}),
        residency="toyland",
    )
    register_runtime(spec)
    try:
        yield spec
    finally:
        unregister_runtime("toy")


def test_register_runtime_in_process(toy: RuntimeSpec) -> None:
    assert runtime_specs()["toy"] is toy
    assert "toy" in rt.MANIFEST and "toy" not in auto_order()  # auto_rank None: never auto
    assert get_spec("toy").origin == "register_runtime()"
    assert validate_annotations({"qf_runtime": "toy"}) == {"qf_runtime": "toy"}
    assert rt.resolve_backend("toy", dtype="uint16").chosen == "toy"
    assert rt.resolve_backend("auto", dtype="uint16").chosen != "toy"
    found = probe_runtime("toy", memory_limit=1000, budget_fraction=0.5)  # host_probe
    assert found == ProbeResult(True, "toy", 1.0, 500, {})
    register_runtime(toy)  # the same declaration again is fine
    with pytest.raises(ParameterError, match="already registered"):
        register_runtime(RuntimeSpec("toy", "m:C", None, frozenset()))
    with pytest.raises(ParameterError, match=r"already registered \(by quantem-flow"):
        register_runtime(RuntimeSpec("cpu", "m:C", None, frozenset()))
    with pytest.raises(ParameterError, match="only in-process registrations"):
        unregister_runtime("cpu")
    # its residency prefix is admitted for chunks
    chunk = qf.representations.Chunk("dense", "toyland:3", ((0, 1), (0, 1)), None, "dense-v1")
    assert chunk.runtime == "cpu"
    with pytest.raises(ParameterError, match="unknown residency"):
        qf.representations.Chunk("dense", "nowhere", ((0, 1), (0, 1)), None, "dense-v1")


def test_a_probe_that_raises_is_unavailable_with_its_reason(toy: RuntimeSpec) -> None:
    import dataclasses

    register_runtime(dataclasses.replace(toy, probe=f"{__name__}:_boom"), replace=True)
    found = probe_runtime("toy", memory_limit=1000)
    assert not found.available and "OSError: no such device node" in found.reason
    with pytest.raises(RuntimeUnavailableError, match=r"toy: .*no such device node"):
        probe_capabilities(runtimes=["toy"])
    assert "toy" not in probe_capabilities()[0]  # not advertised by "every available one"


def test_resolve_backend_checks_the_dtype() -> None:
    spec = get_spec("cuda")
    assert not spec.supports("frame_pass", "dense", "uint64")
    with pytest.raises(UnsupportedOperationError, match=r"'cuda' has no kernel.*uint64.*'cpu'"):
        rt.resolve_backend("cuda", dtype="uint64")
    with pytest.raises(UnsupportedOperationError, match=r"'cuda' has no kernel.*paired.*\['cpu'"):
        rt.resolve_backend("cuda", representation="paired", dtype="uint64")
    with pytest.raises(UnsupportedOperationError, match="float32"):
        rt.resolve_backend("cpu", representation="paired", dtype="float32")
    choice = rt.resolve_backend("auto", representation="packed", dtype="int8")
    assert choice.chosen == "cpu"
    assert "cuda (no 'frame_pass' on 'packed' int8 kernel)" in choice.reason
    both = rt.resolve_backend("cpu", operation=("frame_pass", "gather"), dtype="int64")
    assert both.chosen == "cpu"
    with pytest.raises(RuntimeUnavailableError, match="unknown runtime 'nope'"):
        rt.resolve_backend("nope")


def test_an_explicit_runtime_lacking_the_dtype_is_refused_by_compute(toy: RuntimeSpec) -> None:
    data = np.zeros((2, 3, 4, 5), dtype=np.float32)
    with pytest.raises(
        UnsupportedOperationError, match=r"'toy' has no kernel for 'frame_pass' on 'dense' float32"
    ):
        qf.compute(qf.sum_diffraction(qf.open(data)), backend="toy", client="synchronous")


def test_ssb_backend_choice_is_derived() -> None:
    assert resolve_ssb_backend("cpu", dtype="uint16").chosen == "cpu"
    with pytest.raises(UnsupportedOperationError, match="allow_complex64"):
        try:
            resolve_ssb_backend("mps")
        except RuntimeUnavailableError:
            pytest.skip("mps unavailable here")
    with pytest.raises(RuntimeUnavailableError, match="unknown runtime"):
        resolve_ssb_backend("nope")
    # one entry point for every operation: resolve_backend(operation="ssb") is the same choice
    via = rt.resolve_backend("auto", operation="ssb", dtype="uint16")
    assert via == resolve_ssb_backend("auto", dtype="uint16")
    assert via.chosen == "cpu" and "SSB FFT stage" in via.reason
    with pytest.raises(RuntimeUnavailableError, match="unknown runtime 'nope' for the SSB"):
        rt.resolve_backend("nope", operation="ssb")


# ----------------------------------------------------------------------------- entry points

DUMMY_MODULE = '''
"""A third-party runtime: the CPU kernels under another name."""

from quantem_flow.runtimes.cpu import CpuRuntime
from quantem_flow.runtimes.registry import ProbeResult, RuntimeSpec

PROBED = []


class DummyRuntime(CpuRuntime):
    name = "dummy"


def probe(*, nthreads, memory_limit, budget_fraction):
    PROBED.append((nthreads, memory_limit, budget_fraction))
    return ProbeResult(True, "dummy device answers", 3.0, 4096, {"device": "dummy"})


def specs():
    kernels = {(op, "dense", "uint16") for op in ("frame_pass", "gather")}
    return [
        RuntimeSpec(
            name="dummy",
            factory="dummy_qf_runtime:DummyRuntime",
            dependency=None,
            kernels=frozenset(kernels),
            auto_rank=None,
            probe="dummy_qf_runtime:probe",
            residency="host",
            description="a test runtime from an installed distribution",
        )
    ]
'''


def _install(site: Path, dist: str, module: str | None, entry_points: str) -> None:
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    name = dist.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}\n")
    if module is not None:
        (site / f"{dist}.py").write_text(textwrap.dedent(module))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder of installed distributions on sys.path; the registry re-reads entry points."""
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield tmp_path
    finally:
        monkeypatch.undo()
        for mod in ("dummy_qf_runtime", "broken_qf_runtime"):
            sys.modules.pop(mod, None)
        importlib.invalidate_caches()
        clear_registry_cache()


def _read_entry_points() -> None:
    importlib.invalidate_caches()
    clear_registry_cache()


def test_an_installed_distribution_registers_a_runtime(
    site: Path, rng: np.random.Generator
) -> None:
    _install(site, "dummy_qf_runtime", DUMMY_MODULE, "dummy = dummy_qf_runtime:specs")
    _read_entry_points()
    specs = runtime_specs()
    assert "dummy" in specs and list(specs)[:3] == ["cpu", "cuda", "mps"]
    spec = specs["dummy"]
    assert spec.distribution == "dummy-qf-runtime 0.1"
    assert spec.origin == "distribution 'dummy-qf-runtime 0.1'"
    assert "dummy" in rt.MANIFEST and "dummy" in rt.available_runtimes()
    assert rt.resolve_backend("dummy", dtype="uint16").chosen == "dummy"
    with pytest.raises(UnsupportedOperationError, match="runtimes that do"):
        rt.resolve_backend("dummy", dtype="float32")
    # the worker probe runs its declared probe
    slots, budgets = probe_capabilities(runtimes=["cpu", "dummy"], memory_limit=10_000)
    assert slots["dummy"] == 3.0 and budgets["dummy"] == 4096
    assert probe_runtime_details(runtimes=["dummy"])["dummy"]["device"] == "dummy"
    assert sys.modules["dummy_qf_runtime"].PROBED  # type: ignore[attr-defined]
    # and it runs through the engine
    data = probe_data(rng, scan=(5, 4), det=(12, 14))
    ds = qf.open(data, chunk_rows=2)

    def lazy() -> list[Any]:
        return [qf.virtual_bf(ds, radius=3.0, center=(6, 7)), qf.sum_diffraction(ds)]

    on_dummy = qf.compute(*lazy(), backend="dummy", client="synchronous")
    on_cpu = qf.compute(*lazy(), backend="cpu", client="synchronous")
    for a, b in zip(on_dummy, on_cpu, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
        ex = a.provenance.execution
        assert ex["runtimes"] == ["dummy"] and ex["backend"]["chosen"] == "dummy"


def test_a_broken_entry_point_is_reported_and_the_builtins_still_work(
    site: Path, rng: np.random.Generator
) -> None:
    _install(site, "broken_qf_runtime", None, "broken = broken_qf_runtime:SPEC")
    _install(
        site,
        "dummy_qf_runtime",
        DUMMY_MODULE,
        "dummy = dummy_qf_runtime:specs\nnot_a_spec = dummy_qf_runtime:PROBED\n"
        "cpu = quantem_flow.runtimes.cpu.spec:SPEC",
    )
    _read_entry_points()
    with pytest.warns(RuntimeRegistryWarning) as caught:
        specs = runtime_specs()
    messages = " | ".join(str(w.message) for w in caught)
    assert "ModuleNotFoundError" in messages and "broken_qf_runtime:SPEC" in messages
    assert "broken-qf-runtime 0.1" in messages
    assert "must load to a RuntimeSpec" in messages  # not_a_spec: a list of other things
    assert "built-in runtime it may not replace" in messages  # cpu
    assert "broken" not in specs and "dummy" in specs  # the good one of the same dist stays
    assert specs["cpu"].distribution is None  # the built-in was not replaced
    errors = entry_point_errors()
    assert set(errors) == {"broken", "not_a_spec", "cpu"}
    with pytest.raises(RuntimeUnavailableError, match=r"'broken' is not registered.*uninstall"):
        rt.resolve_backend("broken")
    with pytest.raises(RuntimeUnavailableError, match="broken-qf-runtime"):
        probe_capabilities(runtimes=["broken"])
    data = probe_data(rng, scan=(3, 4), det=(10, 12))
    (total,) = qf.compute(qf.sum_diffraction(qf.open(data)), backend="cpu", client="synchronous")
    np.testing.assert_array_equal(total.data, data.sum(axis=(0, 1), dtype=np.int64))
    assert "cpu" in manifest()


def test_memory_pools_and_host_copies_come_from_the_declarations(toy: RuntimeSpec) -> None:
    from quantem_flow.graphs.capabilities import memory_pool
    from quantem_flow.graphs.lowering import _host_copy_value_bytes

    assert memory_pool("toy") == "toyland"  # no pool declared: its residency
    assert memory_pool("cpu") == "host"
    assert memory_pool("mps") == "host"  # declared: unified memory / host RAM
    assert get_spec("mps").host_copy_value_bytes == 4
    assert _host_copy_value_bytes("mps") == 4 and _host_copy_value_bytes("cpu") is None
    unregister_runtime("toy")
    shared = dataclasses.replace(toy, memory_pool="host", host_copy_value_bytes=2)
    register_runtime(shared)
    assert memory_pool("toy") == "host"
    assert _host_copy_value_bytes("toy") == 2


def test_auto_passes_over_a_runtime_whose_class_does_not_import() -> None:
    broken = RuntimeSpec(
        name="brokenrt",
        factory="quantem_flow_no_such_module:Runtime",
        dependency=None,
        kernels=frozenset({("frame_pass", "dense", "uint16")}),
        auto_rank=1,
    )
    register_runtime(broken)
    try:
        choice = rt.resolve_backend("auto", dtype="uint16")
        assert choice.chosen != "brokenrt"
        assert "brokenrt" in choice.reason
    finally:
        unregister_runtime("brokenrt")


def test_the_moved_ssb_kernels_module_still_answers() -> None:
    from quantem_flow.runtimes import array_ops, ssb_kernels
    from quantem_flow.runtimes.cpu.array_ops import NumpyOps

    assert ssb_kernels.ArrayOps is array_ops.ArrayOps
    assert ssb_kernels.NumpyOps is NumpyOps
    with pytest.raises(AttributeError, match=r"quantem_flow\.operators\.ssb\.stages"):
        ssb_kernels.QGrid  # noqa: B018


def test_the_reference_runtime_is_declared_from_its_hello(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its row's kernels are what its worker's hello says, not a table kept beside it."""
    from quantem_flow.runtimes.external import spec as external
    from quantem_flow.runtimes.external.reference_worker import ReferenceWorker

    hello = ReferenceWorker().hello().header
    assert external.reference_spec().kernels == frozenset(tuple(k) for k in hello["kernels"])
    assert "external-reference" in external.HELLO_DECLARED
    real = ReferenceWorker.hello

    def without_float64(self: ReferenceWorker) -> Any:
        message = real(self)
        message.header["kernels"] = [k for k in message.header["kernels"] if k[2] != "float64"]
        return message

    monkeypatch.setattr(ReferenceWorker, "hello", without_float64)
    kernels = external.reference_spec().kernels
    assert kernels and all(dtype != "float64" for _, _, dtype in kernels)
