"""One registry mechanism (quantem_flow.plugins), as the representations use it."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import ParameterError
from quantem_flow.plugins import PluginWarning, Registry, load_attribute
from quantem_flow.representations import (
    ENTRY_POINT_GROUP,
    REPRESENTATION_REGISTRY,
    REPRESENTATIONS,
    get_representation,
    representation_names,
)
from quantem_flow.representations.chunk import check_representation

PLUGIN = '''
import numpy as np
from quantem_flow.representations.base import Representation


class Halves(Representation):
    """A toy layout: the frames in two halves (exact both ways)."""

    name = "halves"
    schema = "halves-v1"

    def from_dense(self, block, **options):
        k = block.shape[-1] // 2
        return (block[..., :k].copy(), block[..., k:].copy())

    def to_dense(self, payload):
        return np.concatenate(payload, axis=-1)


class Misnamed(Halves):
    name = "not-its-row"
'''


def _install(site: Path, dist: str, module: str, rows: str) -> None:
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{rows}\n")
    (site / f"{dist}.py").write_text(textwrap.dedent(module))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    REPRESENTATION_REGISTRY.clear()
    try:
        yield folder
    finally:
        monkeypatch.undo()
        sys.modules.pop("qf_halves", None)
        importlib.invalidate_caches()
        REPRESENTATION_REGISTRY.clear()


def test_the_builtins_load_lazily_and_once() -> None:
    assert representation_names()[:4] == ["dense", "paired", "packed", "encoded"]
    assert list(REPRESENTATIONS)[:4] == ["dense", "paired", "packed", "encoded"]
    assert get_representation("paired") is get_representation("paired")
    assert REPRESENTATION_REGISTRY.origin("dense") == "built-in"
    with pytest.raises(ParameterError, match="unknown representation 'nope'; known: \\['dense'"):
        get_representation("nope")


def test_an_installed_distribution_adds_a_representation(site: Path) -> None:
    _install(
        site,
        "qf_halves",
        PLUGIN,
        "halves = qf_halves:Halves\nbroken = qf_halves:Misnamed\ndense = qf_halves:Halves",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = representation_names()
    assert "halves" in names and check_representation("halves") == "halves"
    assert any(
        issubclass(w.category, PluginWarning) and "a built-in representation" in str(w.message)
        for w in caught
    )  # a plug-in may not replace 'dense'
    assert get_representation("dense").__class__.__module__ == "quantem_flow.representations.dense"
    rep = get_representation("halves")
    block = np.arange(2 * 3 * 4 * 6, dtype=np.uint16).reshape(2, 3, 4, 6)
    assert np.array_equal(rep.to_dense(rep.from_dense(block)), block)
    assert np.array_equal(
        rep.gather(rep.from_dense(block), np.array([0, 5, 23])), block.reshape(6, 24)[:, [0, 5, 23]]
    )
    assert REPRESENTATION_REGISTRY.origin("halves") == "distribution 'qf_halves 0.1'"
    with (
        pytest.warns(PluginWarning, match="fix or uninstall its distribution"),
        pytest.raises(
            ParameterError, match=r"'broken' of distribution 'qf_halves 0\.1'.*not-its-row"
        ),
    ):
        get_representation("broken")
    assert "broken" in REPRESENTATION_REGISTRY.errors()
    with warnings.catch_warnings():  # reported once: asking again raises without a warning
        warnings.simplefilter("error")
        with pytest.raises(ParameterError, match="not-its-row"):
            get_representation("broken")


def test_registering_in_process_and_the_targets_checked() -> None:
    reg: Registry[int] = Registry(
        "number", "quantem_flow.test_numbers", {"one": "math:pi"}, lambda n, v: int(v)
    )
    assert reg.get("one") == 3
    reg.register("two", 2)
    assert reg.names() == ["one", "two"] and reg.origin("two") == "registered in process"
    with pytest.raises(ParameterError, match="built-in number"):
        reg.register("one", 1)
    with pytest.raises(ParameterError, match="already registered"):
        reg.register("two", 22)
    reg.register("two", 22, replace=True)
    assert reg.get("two") == 22
    reg.unregister("two")
    assert reg.names() == ["one"]
    with pytest.raises(ParameterError, match="module:attribute"):
        load_attribute("no-colon")
