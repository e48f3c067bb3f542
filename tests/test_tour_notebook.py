"""docs/notebooks/tour.ipynb runs as written in a Jupyter kernel, with rich output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebooks" / "tour.ipynb"


def test_the_tour_notebook_runs(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        mp.setenv("QUANTEM_FLOW_LOCAL_WORKERS", "2")
        client.execute()
    outputs = [o for cell in nb.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("Dataset4D" in h for h in html)  # the dataset's summary
    assert any("data:image/png;base64" in h and "adf" in h for h in html)  # a result's thumbnail
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "SSB phase vs the truth: r = " in text
    assert "double-overlap loss" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the figure
