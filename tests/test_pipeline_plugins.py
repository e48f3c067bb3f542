"""A third-party pipeline operation: one installed distribution, one entry point, nothing else.

A dummy distribution is installed into a folder on ``sys.path``; its entry point
in the group ``quantem_flow.operations`` names an operator function.  A
pipeline then names it as ``op:``, its keys come from the function's signature,
its values are checked as the function annotates them, its meaning in the
reference comes from its numpydoc, and a broken entry point is reported
without hiding the built-in operations.
"""

from __future__ import annotations

import importlib
import math
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError
from quantem_flow.pipeline import (
    OPERATION_REGISTRY,
    OPERATIONS,
    PIPELINE_OPERATIONS,
    load_pipeline,
    operations_reference,
    run_pipeline,
)
from quantem_flow.pipeline.schema import ENTRY_POINT_GROUP
from quantem_flow.plugins import PluginWarning

MODULE = '''
import quantem_flow as qf


def ring_sum(ds, *, inner: float, outer: float = float("inf"), rows: int = 1, name=None):
    """The counts in a ring around the detector's middle (a third-party operation).

    Parameters
    ----------
    ds
        The dataset.
    inner
        Inner radius of the ring, pixels (included).
    outer
        Outer radius of the ring, pixels (excluded).
    rows
        A number of rows, checked as an integer.
    name
        Label of the result.

    Returns
    -------
    LazyResult
        A lazy scan image (counts).
    """
    kr, kc = ds.shape[2:]
    center = ((kr - 1) / 2, (kc - 1) / 2)
    return qf.virtual_annular(
        ds, inner=inner, outer=outer, center=center, name=name or "ring_sum"
    )


NOT_AN_OPERATOR = 42
'''


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "site"
    info = folder / "qf_ringsum-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qf-ringsum\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        "ring_sum = qf_ringsum:ring_sum\n"
        "not_an_operator = qf_ringsum:NOT_AN_OPERATOR\n"
        "ssb = qf_ringsum:ring_sum\n"
    )
    (folder / "qf_ringsum.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    OPERATION_REGISTRY.clear()
    try:
        yield folder
    finally:
        monkeypatch.undo()
        sys.modules.pop("qf_ringsum", None)
        importlib.invalidate_caches()
        OPERATION_REGISTRY.clear()


def test_an_installed_operation_runs_in_a_pipeline(site: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    data = rng.poisson(5.0, size=(6, 7, 16, 16)).astype(np.uint16)
    np.save(tmp_path / "d.npy", data)
    with pytest.warns(PluginWarning) as caught:
        keys = OPERATIONS["ring_sum"]
    messages = " | ".join(str(w.message) for w in caught)
    assert "a built-in pipeline operation it may not replace" in messages  # ssb
    assert keys == ("inner", "outer", "rows")
    assert list(OPERATIONS)[: len(PIPELINE_OPERATIONS)] == [op.name for op in PIPELINE_OPERATIONS]
    assert OPERATION_REGISTRY.origin("ring_sum") == "distribution 'qf-ringsum 0.1'"
    spec = {
        "version": 1,
        "input": {"path": "d.npy"},
        "outputs": {"ring": {"op": "ring_sum", "inner": 3, "rows": 2}},
    }
    results = run_pipeline(load_pipeline(spec, base_dir=tmp_path), client="synchronous")
    (want,) = qf.compute(
        qf.virtual_annular(qf.open(data), inner=3.0, outer=math.inf, center=(7.5, 7.5)),
        client="synchronous",
    )
    np.testing.assert_array_equal(np.asarray(results["ring"]), np.asarray(want))
    # values are checked as the function annotates them
    bad = {**spec, "outputs": {"ring": {"op": "ring_sum", "inner": 3, "rows": 1.5}}}
    with pytest.raises(ParameterError, match=r"outputs\.ring\.rows: expected an integer"):
        load_pipeline(bad, base_dir=tmp_path)
    auto = {**spec, "outputs": {"ring": {"op": "ring_sum", "inner": "auto"}}}
    with pytest.raises(ParameterError, match=r"outputs\.ring\.inner: expected a number"):
        load_pipeline(auto, base_dir=tmp_path)  # a built-in's `auto` radius is not its
    missing = {**spec, "outputs": {"ring": {"op": "ring_sum"}}}
    with pytest.raises(ParameterError, match="missing required key 'inner'"):
        load_pipeline(missing, base_dir=tmp_path)
    # the reference documents it from its numpydoc, naming its distribution
    reference = operations_reference()
    block = reference.split("### `ring_sum`", 1)[1]
    assert "(distribution 'qf-ringsum 0.1')" in block
    assert "| `inner` | number |  | **required** | Inner radius of the ring, pixels" in block
    assert "| `rows` | integer |  | `1` |" in block


def test_a_broken_operation_is_reported_and_the_builtins_work(site: Path, tmp_path: Path) -> None:
    with pytest.warns(PluginWarning):
        names = list(OPERATIONS)
    assert "not_an_operator" not in names and "ssb" in names
    errors = OPERATION_REGISTRY.errors()
    assert "neither a PipelineOperation nor an operator function" in errors["not_an_operator"]
    assert "qf-ringsum 0.1" in errors["not_an_operator"]
    spec = {
        "version": 1,
        "input": {"path": "d.npy"},
        "outputs": {"x": {"op": "not_an_operator"}},
    }
    with pytest.raises(ParameterError, match="unknown op 'not_an_operator'"):
        load_pipeline(spec, base_dir=tmp_path)
