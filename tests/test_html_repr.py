"""HTML representations in notebooks, and the progress bar's class without ipywidgets."""

from __future__ import annotations

import base64
import io
import sys
import warnings
from typing import Any

import numpy as np
import pytest
from PIL import Image

import quantem_flow as qf
from quantem_flow.graphs import runner
from tests.conftest import probe_data


@pytest.fixture(scope="module")
def computed() -> dict[str, Any]:
    data = probe_data(np.random.default_rng(11), scan=(6, 9))
    ds = qf.open(data, calibration=qf.Calibration(scan_sampling=0.5, scan_units="nm"))
    bf, com, mean = qf.compute(
        qf.virtual_bf(ds), qf.center_of_mass(ds), qf.mean_diffraction(ds), client="synchronous"
    )
    return {"ds": ds, "bf": bf, "com": com, "mean": mean}


def _thumbnail(text: str) -> Image.Image:
    b64 = text.split('src="data:image/png;base64,', 1)[1].split('"', 1)[0]
    return Image.open(io.BytesIO(base64.b64decode(b64)))


@pytest.mark.parametrize("name", ["bf", "com", "mean"])
def test_result_html_has_thumbnail_shape_units_and_provenance(
    computed: dict[str, Any], name: str
) -> None:
    result = computed[name]
    text = result._repr_html_()
    image = _thumbnail(text)
    rows, cols = result.shape[-2:]
    assert max(image.size) == 160 and image.size[0] / image.size[1] == pytest.approx(
        cols / rows, rel=0.05
    )
    assert np.asarray(image).std() > 0  # it shows something, not a flat square
    for piece in (result.kind, str(result.shape), result.units, result.provenance.operator):
        assert piece in text
    assert "nm" in text or name == "mean"


def test_result_html_escapes_and_copes_with_nothing_finite(computed: dict[str, Any]) -> None:
    import dataclasses

    bf = computed["bf"]
    odd = dataclasses.replace(bf, data=np.full(bf.shape, np.nan), name="<b>x</b>")
    text = odd._repr_html_()
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text
    assert "no finite value" in text


def test_dataset_html_reads_nothing(
    computed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = computed["ds"]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the HTML repr must not read")

    monkeypatch.setattr(type(ds.source), "read", refuse)
    text = ds._repr_html_()
    assert "(6, 9, 20, 26)" in text and "uint16" in text and "lazy: nothing read" in text
    assert "[0.5, 0.5] nm" in text


def test_progress_bar_without_ipywidgets_is_text_and_warns_nothing(
    monkeypatch: pytest.MonkeyPatch, cluster_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runner, "_in_notebook", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails as when not installed
    monkeypatch.setattr(runner, "_WIDGET_HINT_SHOWN", [])
    assert runner.progress_bar_class().__module__ == "tqdm.std"
    assert "quantem-flow[notebook]" in caplog.text
    ds = qf.open(probe_data(np.random.default_rng(2), scan=(4, 4)), chunk_rows=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a TqdmWarning would fail here
        (bf,) = qf.compute(
            qf.virtual_bf(ds, radius=3, center=(8, 14)), client=cluster_client, progress=True
        )
    assert bf.shape == (4, 4)
    monkeypatch.delitem(sys.modules, "ipywidgets")
    pytest.importorskip("ipywidgets")
    assert runner.progress_bar_class().__module__ == "tqdm.notebook"
    monkeypatch.setattr(runner, "_in_notebook", lambda: False)
    assert runner.progress_bar_class().__module__ == "tqdm.std"
