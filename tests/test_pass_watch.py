"""Passes register with the scheduler's plugin through their graph; departures are pushed.

A pass through a cluster used to ask the scheduler twice (register, then
the workers that left); both now ride on messages that go anyway: the
``qf_pass`` annotation of the graph and the plugin's event topic
(graphs/pass_watch.py).  Worker loss in the pass provenance is checked
end to end in tests/test_worker_restart.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import AnnotationError
from quantem_flow.graphs import validate_annotations
from quantem_flow.graphs.pass_watch import PassWatch, pass_watch
from quantem_flow.graphs.scheduler_plugin import PLUGIN_NAME
from tests.conftest import probe_data


def _departure(seq: int, **extra: Any) -> tuple[float, dict[str, Any]]:
    return 0.0, {"departure": {"seq": seq, "worker": f"tcp://127.0.0.1:{seq}", **extra}}


def test_departures_are_those_since_the_earliest_cursor_of_the_passes() -> None:
    watch = PassWatch()
    assert watch.departures(["qf-pass-a"]) is None  # never registered: no plugin
    watch.handle(_departure(0, lost=True))
    watch.handle((1.0, {"pass": "qf-pass-a", "cursor": 1}))
    watch.handle(_departure(1, lost=True))
    watch.handle((2.0, {"pass": "qf-pass-b", "cursor": 2}))
    watch.handle(_departure(2, lost=False))
    assert [d["seq"] for d in watch.departures(["qf-pass-a"]) or []] == [1, 2]
    assert [d["seq"] for d in watch.departures(["qf-pass-b"]) or []] == [2]
    assert [d["seq"] for d in watch.departures(["qf-pass-b", "qf-pass-a"]) or []] == [1, 2]
    assert watch.departures(["qf-pass-c"]) is None
    assert watch.cursor("qf-pass-b") == 2


def test_a_changed_departure_replaces_the_one_before() -> None:
    watch = PassWatch()
    watch.handle((0.0, {"pass": "p", "cursor": 0}))
    watch.handle(_departure(0, lost=True, restored=False))
    watch.handle(_departure(0, lost=True, restored=True))
    (record,) = watch.departures(["p"]) or []
    assert record["restored"] is True


def test_messages_that_are_not_pass_events_are_ignored() -> None:
    watch = PassWatch()
    for event in (None, (0.0, "text"), (0.0, {"other": 1}), (0.0, {"departure": {}})):
        watch.handle(event)
    assert watch.departures(["p"]) is None and watch.cursor("p") is None


def test_the_qf_pass_annotation_is_checked() -> None:
    info = {"name": "qf-pass-x", "kind": "pass", "chunks": [[0, 2]]}
    assert validate_annotations({"qf_pass": info}) == {"qf_pass": info}
    for bad in ("qf-pass-x", {"kind": "pass"}, {"name": 3}):
        with pytest.raises(AnnotationError, match="qf_pass"):
            validate_annotations({"qf_pass": bad})


@pytest.mark.cluster
def test_a_pass_registers_without_asking_the_scheduler(
    rng: np.random.Generator, cluster_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = cluster_client
    ds = qf.open(probe_data(rng, scan=(6, 5)), chunk_rows=2)
    # a first pass installs the plugin if needed (once per scheduler) and subscribes
    qf.compute(qf.virtual_bf(ds, radius=3, center=(8, 8)), client=client, progress=False)
    asked: list[str] = []
    real = client.run_on_scheduler

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(getattr(fn, "__name__", repr(fn)))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(client, "run_on_scheduler", counting)
    (bf,) = qf.compute(qf.virtual_bf(ds, radius=3, center=(8, 8)), client=client, progress=False)
    assert asked == []
    assert bf.provenance.execution["scheduler"].startswith("given distributed.Client")
    monkeypatch.undo()

    def passes(dask_scheduler: Any) -> dict[str, Any]:
        state = dask_scheduler.plugins[PLUGIN_NAME].state()
        return {p["name"]: p for p in state["passes"]}

    registered = client.run_on_scheduler(passes)
    mine = [p for p in registered.values() if p["scan_shape"] == [6, 5]]
    assert mine and mine[-1]["chunks"] == [[0, 2], [2, 4], [4, 6]]
    cursor = pass_watch(client).cursor(mine[-1]["name"])
    assert cursor is not None and cursor >= 0
