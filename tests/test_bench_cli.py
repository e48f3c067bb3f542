"""`quantem-flow bench` writes a performance report from a real run."""

from __future__ import annotations

import json

import pytest

from quantem_flow.cli import main


@pytest.mark.cluster
def test_bench_writes_a_report(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--output-dir",
            str(out),
            "--scan-shape",
            "24",
            "32",
            "--detector-shape",
            "40",
            "48",
            "--repeat",
            "1",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "report:" in printed and str(out / "report.md") in printed
    report = json.loads((out / "report.json").read_text())
    r = report["results"]
    for key in (
        "pass_from_file_s",
        "pass_resident_s",
        "adf_ring_query_resident_s",
        "adf_ring_query_file_s",
        "persist_s",
    ):
        assert r[key] > 0
    assert report["dataset"]["shape"] == [24, 32, 40, 48]
    assert report["machine"]["dashboard"].startswith("http://127.0.0.1:")
    # every chunk has one holder, and the resident queries moved no chunk
    assert all(len(ws) == 1 for ws in r["chunk_placement"].values())
    assert r["bytes_moved_between_workers_during_resident_queries"] < 24 * 32 * 40 * 48 * 2
    html = (out / "dask-performance-report.html").read_text()
    assert "cdn.bokeh.org" not in html  # self-contained: opens offline
    md = (out / "report.md").read_text()
    assert "| BF+ADF+CoM on resident chunks |" in md
    # quantem-flow's own charts beside Dask's report: self-contained, with the run's data
    charts = out / "quantem-flow-dashboard.html"
    assert report["outputs"]["quantem_flow_charts"] == str(charts)
    assert "quantem-flow-dashboard.html" in md and f"Everything is in {out}." in md
    page = charts.read_text()
    assert "cdn.bokeh.org" not in page
    for name in ("qf-throughput", "qf-scan-map", "qf-resident", "qf-progress", "qf-log"):
        assert f'"name":"{name}"' in page.replace(" ", ""), name
    assert report["machine"]["quantem_flow_dashboard"].endswith("/quantem-flow")


def test_bench_output_folder_is_ignored_by_git() -> None:
    from pathlib import Path

    from quantem_flow.cli import _parser

    default = _parser().parse_args(["bench"]).output_dir
    assert default == "quantem-flow-bench"
    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    assert f"/{default}/" in ignored
