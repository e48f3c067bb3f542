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
    assert "| BF+ADF+CoM on resident chunks |" in (out / "report.md").read_text()
