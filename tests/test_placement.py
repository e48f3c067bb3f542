"""The placement state machine, driven directly: no cluster, deterministic."""

from __future__ import annotations

from quantem_flow.graphs.capabilities import WorkerCapabilities, parse_resources
from quantem_flow.graphs.placement import (
    ChunkForgotten,
    ChunkInMemory,
    Placement,
    Refuse,
    Restrict,
    TaskInfo,
    TasksForgotten,
    TasksSubmitted,
    WorkerJoined,
    WorkerLeft,
    tasks_from_annotations,
)

MiB = 2**20


def worker(addr: str, runtimes: dict[str, int], budgets: dict[str, int]) -> WorkerJoined:
    return WorkerJoined(
        WorkerCapabilities(addr, frozenset(runtimes), dict(runtimes), dict(budgets))
    )


def loads(n: int, nbytes: int, runtime: str = "cpu") -> list[TaskInfo]:
    return [TaskInfo(("load", i), "load", runtime, "dense", None, nbytes) for i in range(n)]


def kernels(n: int, runtime: str = "cpu") -> list[TaskInfo]:
    return [TaskInfo(("k", i), "kernel", runtime, "dense", ("load", i)) for i in range(n)]


def restrictions(decisions: list) -> dict:
    return {d.key: d.workers for d in decisions if isinstance(d, Restrict)}


def test_loads_balance_by_free_budget_and_kernels_follow() -> None:
    p = Placement()
    p.handle_all(
        [worker("a", {"cpu": 1}, {"cpu": 400 * MiB}), worker("b", {"cpu": 1}, {"cpu": 300 * MiB})]
    )
    d = p.handle(TasksSubmitted(tuple(loads(4, 100 * MiB) + kernels(4))))
    r = restrictions(d)
    # a has more room: a, then tie 300/300 -> fewer chunks (b), then a, then b
    assert [r[("load", i)] for i in range(4)] == [frozenset({x}) for x in "abab"]
    for i in range(4):
        assert r[("k", i)] == r[("load", i)]
    assert p.resident_by_worker() == {"a": {"dense": 200 * MiB}, "b": {"dense": 200 * MiB}}
    assert all(isinstance(x, Restrict) for x in d)


def test_kernels_submitted_later_pin_to_the_actual_holder() -> None:
    p = Placement()
    p.handle_all([worker("a", {"cpu": 1}, {"cpu": 10**9}), worker("b", {"cpu": 1}, {"cpu": 10**9})])
    p.handle(TasksSubmitted(tuple(loads(1, 10))))
    assert p.handle(ChunkInMemory(("load", 0), "b", 12)) == [] or True
    d = p.handle(TasksSubmitted(tuple(kernels(1))))
    assert restrictions(d)[("k", 0)] == frozenset({"b"})


def test_chunk_landing_elsewhere_repins_dependents() -> None:
    p = Placement()
    p.handle_all([worker("a", {"cpu": 1}, {"cpu": 10**9}), worker("b", {"cpu": 1}, {"cpu": 10**8})])
    p.handle(TasksSubmitted(tuple(loads(1, 10) + kernels(1))))
    assert p.planned[("load", 0)] == "a"
    d = p.handle(ChunkInMemory(("load", 0), "b"))
    assert restrictions(d) == {("k", 0): frozenset({"b"})}
    assert p.log[-1]["event"] == "chunk-landed-elsewhere"


def test_worker_leaving_replaces_its_chunks_and_moves_their_kernels() -> None:
    p = Placement()
    p.handle_all([worker("a", {"cpu": 1}, {"cpu": 10**9}), worker("b", {"cpu": 1}, {"cpu": 10**9})])
    p.handle(TasksSubmitted(tuple(loads(4, 10) + kernels(4))))
    for i in range(4):
        p.handle(ChunkInMemory(("load", i), p.planned[("load", i)]))
    on_a = sorted(k for k, w in p.planned.items() if w == "a")
    d = p.handle(WorkerLeft("a"))
    r = restrictions(d)
    for k in on_a:
        assert r[k] == frozenset({"b"})
        assert r[("k", k[1])] == frozenset({"b"})
    assert ("load", 0) in on_a
    assert p.holder.get(on_a[0]) is None  # not in memory until it lands again
    assert not any(isinstance(x, Refuse) for x in d)


def test_last_capable_worker_leaving_waits_and_a_rejoin_places_again() -> None:
    p = Placement()
    p.handle_all(
        [
            worker("gpu", {"cpu": 1, "mps": 1}, {"mps": 10**9}),
            worker("cpu", {"cpu": 1}, {"cpu": 10**9}),
        ]
    )
    p.handle(TasksSubmitted(tuple(loads(2, 10, "mps") + kernels(2, "mps"))))
    assert set(p.planned.values()) == {"gpu"}
    d = p.handle(WorkerLeft("gpu"))
    assert not any(isinstance(x, Refuse) for x in d)
    assert all(x.workers == frozenset() for x in d)  # waiting, never on the cpu-only worker
    assert set(p.pending) == {("load", 0), ("load", 1), ("k", 0), ("k", 1)}
    d = p.handle(worker("gpu2", {"cpu": 1, "mps": 1}, {"mps": 10**9}))
    assert restrictions(d) == {
        k: frozenset({"gpu2"}) for k in [("load", 0), ("load", 1), ("k", 0), ("k", 1)]
    }
    assert not p.pending


def test_graph_submitted_before_any_worker_waits() -> None:
    p = Placement()
    (d,) = p.handle(TasksSubmitted((TaskInfo("t", "pass", "cpu"),)))
    assert isinstance(d, Restrict) and d.workers == frozenset()
    assert restrictions(p.handle(worker("a", {"cpu": 1}, {}))) == {"t": frozenset({"a"})}


def test_tasks_never_land_on_workers_without_their_runtime() -> None:
    p = Placement()
    p.handle_all([worker("mlx", {"cpu": 1, "mps": 1}, {}), worker("np", {"cpu": 2}, {})])
    tasks = (
        TaskInfo("p-mps", "pass", "mps"),
        TaskInfo("p-cpu", "pass", "cpu"),
        TaskInfo("combine", "combine", "any"),
    )
    r = restrictions(p.handle(TasksSubmitted(tasks)))
    assert r["p-mps"] == frozenset({"mlx"})
    assert r["p-cpu"] == frozenset({"mlx", "np"})
    assert "combine" not in r  # anywhere: no restriction


def test_no_capable_worker_is_refused_with_a_clear_reason() -> None:
    p = Placement()
    p.handle(worker("np", {"cpu": 2}, {}))
    (d,) = p.handle(TasksSubmitted((TaskInfo("t", "pass", "cuda"),)))
    assert isinstance(d, Refuse)
    assert "cuda" in d.reason and "np" in d.reason and "quantem-flow worker" in d.reason


def test_admission_places_elsewhere_when_full_and_refuses_when_nowhere_fits() -> None:
    p = Placement()
    p.handle_all([worker("a", {"cpu": 1}, {"cpu": 250}), worker("b", {"cpu": 1}, {"cpu": 120})])
    d = p.handle(TasksSubmitted(tuple(loads(3, 100))))
    r = restrictions(d)
    assert r[("load", 0)] == frozenset({"a"})  # 250 free
    assert r[("load", 1)] == frozenset({"a"})  # a 150 free > b 120
    assert r[("load", 2)] == frozenset({"b"})  # a 50, b 120
    d = p.handle(TasksSubmitted((TaskInfo(("load", 9), "load", "cpu", "dense", None, 100),)))
    (refused,) = d
    assert isinstance(refused, Refuse)
    assert "admission refused" in refused.reason and "100 bytes" in refused.reason
    # a worker that filled up is passed over for one with room, and the choice is recorded
    p2 = Placement()
    p2.handle_all([worker("a", {"cpu": 1}, {"cpu": 150}), worker("b", {"cpu": 1}, {"cpu": 140})])
    p2.handle(TasksSubmitted((TaskInfo("x", "load", "cpu", "dense", None, 60),)))
    d = p2.handle(TasksSubmitted((TaskInfo("y", "load", "cpu", "dense", None, 130),)))
    assert restrictions(d)["y"] == frozenset({"b"})
    assert p2.log[-1] == {
        "event": "placed",
        "key": "'y'",
        "worker": "b",
        "reason": "most free budget",
        "nbytes": 130,
        "free_before": 140,
    }


def test_pass_task_larger_than_every_budget_is_refused() -> None:
    p = Placement()
    p.handle(worker("a", {"mps": 1, "cpu": 1}, {"mps": 100}))
    (d,) = p.handle(TasksSubmitted((TaskInfo("t", "pass", "mps", nbytes=1000),)))
    assert isinstance(d, Refuse) and "does not fit" in d.reason


def test_conflict_resident_on_a_worker_without_the_kernels_runtime() -> None:
    p = Placement()
    p.handle_all([worker("mlx", {"mps": 1}, {}), worker("np", {"cpu": 1}, {})])
    p.handle(TasksSubmitted(tuple(loads(1, 10, "mps"))))
    (d,) = p.handle(TasksSubmitted((TaskInfo("k", "kernel", "cpu", "dense", ("load", 0)),)))
    assert isinstance(d, Refuse) and "conflict" in d.reason


def test_joining_worker_gets_new_chunks_not_old_ones() -> None:
    p = Placement()
    p.handle(worker("a", {"cpu": 1}, {"cpu": 1000}))
    p.handle(TasksSubmitted(tuple(loads(2, 100))))
    assert p.handle(worker("b", {"cpu": 1}, {"cpu": 1000})) == []
    assert set(p.planned.values()) == {"a"}
    d = p.handle(TasksSubmitted((TaskInfo("new", "load", "cpu", "dense", None, 100),)))
    assert restrictions(d)["new"] == frozenset({"b"})


def test_forgetting_releases_budget() -> None:
    p = Placement()
    p.handle(worker("a", {"cpu": 1}, {"cpu": 100}))
    p.handle(TasksSubmitted(tuple(loads(1, 100))))
    assert p.free("a", "cpu") == 0
    p.handle(TasksForgotten((("load", 0),)))
    assert p.free("a", "cpu") == 100
    p.handle(TasksSubmitted(tuple(loads(1, 100))))
    p.handle(ChunkForgotten(("load", 0)))
    assert p.free("a", "cpu") == 100


def test_deterministic_for_the_same_events() -> None:
    def run() -> list:
        p = Placement()
        p.handle_all([worker(x, {"cpu": 1}, {"cpu": 1000}) for x in "cab"])
        return p.handle(TasksSubmitted(tuple(loads(7, 50) + kernels(7))))

    assert run() == run()


def test_tasks_from_annotations_and_plain_workers() -> None:
    ann = {
        "qf_role": {"l0": "load", "k0": "kernel", "c": "combine"},
        "qf_runtime": {"l0": "cpu", "k0": "cpu", "c": "any"},
        "qf_nbytes": {"l0": 64},
    }
    infos = tasks_from_annotations(["l0", "k0", "c", "plain"], ann, {"k0": ["l0"], "c": ["k0"]})
    by = {t.key: t for t in infos}
    assert set(by) == {"l0", "k0", "c"}
    assert by["k0"].resident == "l0" and by["l0"].nbytes == 64
    w = parse_resources("tcp://x", {}, nthreads=3, memory_limit=1000)
    assert w.runtimes == frozenset({"cpu"}) and w.budgets == {"cpu": 1000} and w.slots == {"cpu": 3}


# -- admission by memory need (issue 11 item 6, issue 12 item 6) ----------------------------------
def pooled(addr: str, runtimes: dict[str, int], budgets: dict[str, int], host: int) -> WorkerJoined:
    """A worker that advertises its host pool as a Dask resource (as quantem-flow workers do)."""
    resources = {f"qf-runtime-{r}": float(n) for r, n in runtimes.items()}
    resources.update({f"qf-budget-{r}": float(b) for r, b in budgets.items()})
    resources["qf-memory-host"] = float(host)
    return WorkerJoined(parse_resources(addr, resources))


def need_detail(rows: int, per_row: int, fixed: int, row_bytes: int) -> dict:
    total = fixed + rows * per_row
    return {
        "total": {"host": total},
        "parts": {"payload (in the staging buffer)": rows * per_row, "kernel": fixed},
        "rows": rows,
        "fixed": {"host": fixed},
        "per_row": {"host": per_row},
        "source_row_bytes": row_bytes,
    }


def pass_task(key: str, detail: dict, runtime: str = "cpu") -> TaskInfo:
    ann = {
        "qf_role": {key: "pass"},
        "qf_runtime": {key: runtime},
        "qf_nbytes": {key: detail["rows"] * detail["per_row"]["host"]},
        "qf_need": {key: detail},
    }
    (info,) = tasks_from_annotations([key], ann, {})
    return info


def test_a_pass_needing_more_than_every_budget_is_refused_with_the_sizes_and_a_chunk_size() -> None:
    p = Placement()
    p.handle_all(
        [
            pooled("a", {"cpu": 1}, {"cpu": 819 * MiB}, 600 * MiB),
            pooled("b", {"cpu": 3}, {"cpu": 819 * MiB}, 500 * MiB),
        ]
    )
    # 8 rows of 100 MiB: the old check (800 MiB <= 819 MiB budget) admitted it
    (d,) = p.handle(TasksSubmitted((pass_task("t", need_detail(8, 100 * MiB, 4 * MiB, 96 * MiB)),)))
    assert isinstance(d, Refuse)
    text = d.reason
    assert "admission refused before reading any chunk" in text
    assert "804.0 MiB" in text and "payload (in the staging buffer) 800.0 MiB" in text
    assert "kernel 4.0 MiB" in text
    assert "'a': {'host': '600.0 MiB'}" in text and "'b': {'host': '500.0 MiB'}" in text
    # (600 - 4) // 100 = 5 rows fit the largest pool: 5 x 96 MiB of source data
    assert "chunk_rows=5)" in text and "chunk_mib=480.0 or less" in text
    # a row larger than every pool: no chunk size helps
    (d,) = p.handle(TasksSubmitted((pass_task("u", need_detail(1, 700 * MiB, 0, 1)),)))
    assert isinstance(d, Refuse) and "Even one scan row does not fit" in d.reason


def test_a_pass_that_fits_requests_its_need_so_a_worker_runs_only_what_fits() -> None:
    p = Placement()
    p.handle_all(
        [
            pooled("a", {"cpu": 3}, {"cpu": 819 * MiB}, 500 * MiB),
            pooled("b", {"cpu": 1}, {"cpu": 819 * MiB}, 200 * MiB),
        ]
    )
    (d,) = p.handle(TasksSubmitted((pass_task("t", need_detail(3, 100 * MiB, 2 * MiB, 1)),)))
    # b's pool cannot hold it; a's holds one at a time: the need is requested from the pool,
    # so Dask's worker runs at most floor(500 / 302) = 1 of these at once on its 3 threads
    assert isinstance(d, Restrict) and d.workers == frozenset({"a"})
    assert d.resources == {"qf-memory-host": float(302 * MiB)}
    assert sum(d.resources.values()) * 2 > 500 * MiB
    # a small task: three at once fit (3 x 150 MiB <= 500 MiB), on both workers
    (d,) = p.handle(TasksSubmitted((pass_task("s", need_detail(1, 148 * MiB, 2 * MiB, 1)),)))
    assert d.workers == frozenset({"a", "b"}) and d.resources == {"qf-memory-host": 150.0 * MiB}


def test_plain_workers_without_pool_resources_keep_the_old_behaviour() -> None:
    p = Placement()
    p.handle(WorkerJoined(parse_resources("plain", {}, nthreads=2, memory_limit=1000)))
    assert not p.workers["plain"].pool_resources and p.workers["plain"].pools == {"host": 1000}
    (d,) = p.handle(TasksSubmitted((TaskInfo("t", "pass", "cpu", nbytes=900),)))
    assert isinstance(d, Restrict) and d.resources is None
    (d,) = p.handle(TasksSubmitted((TaskInfo("u", "pass", "cpu", nbytes=1001),)))
    assert isinstance(d, Refuse) and "does not fit" in d.reason


def test_cpu_and_mps_budgets_of_the_same_ram_are_one_pool() -> None:
    # an Apple-silicon worker: cpu and mps budgets are the same unified memory
    caps = parse_resources(
        "m",
        {
            "qf-runtime-cpu": 4.0,
            "qf-runtime-mps": 1.0,
            "qf-budget-cpu": 1000.0,
            "qf-budget-mps": 900.0,
            "qf-memory-host": 1000.0,
        },
    )
    assert caps.pools == {"host": 1000} and caps.pool_resources
    p = Placement()
    p.handle(WorkerJoined(caps))
    d = p.handle(TasksSubmitted(tuple(loads(1, 600, "cpu"))))
    assert restrictions(d)[("load", 0)] == frozenset({"m"})
    assert p.free("m", "mps") == 400  # what cpu chunks hold is gone for mps too
    (d,) = p.handle(TasksSubmitted((TaskInfo("mps-load", "load", "mps", "dense", None, 600),)))
    assert isinstance(d, Refuse) and "admission refused" in d.reason
    # a worker without pool resources derives the same single pool from its budgets
    derived = WorkerCapabilities("w", frozenset({"cpu", "mps"}), {}, {"cpu": 1000, "mps": 900})
    assert derived.pools == {"host": 1000}


def test_worker_resources_advertise_one_pool_for_shared_memory() -> None:
    from quantem_flow.graphs.capabilities import capability_resources, memory_pool

    assert memory_pool("cpu") == memory_pool("mps") == "host"
    assert memory_pool("cuda") == "cuda"
    res = capability_resources({"cpu": 4, "mps": 1}, {"cpu": 1000, "mps": 900})
    assert res["qf-memory-host"] == 1000.0 and not any(
        k.startswith("qf-memory-") and k != "qf-memory-host" for k in res
    )
    res = capability_resources({"cpu": 1, "cuda": 1}, {"cpu": 1000, "cuda": 500})
    assert res["qf-memory-host"] == 1000.0 and res["qf-memory-cuda"] == 500.0


def test_a_pass_requests_only_the_pools_its_workers_advertise() -> None:
    # a CUDA-only worker advertises its device pool, not the host one: requesting host
    # memory from it would leave the task waiting forever
    caps = parse_resources(
        "gpu", {"qf-runtime-cuda": 1.0, "qf-budget-cuda": 1000.0, "qf-memory-cuda": 1000.0}
    )
    assert caps.pool_resources == frozenset({"cuda"})
    p = Placement()
    p.handle(WorkerJoined(caps))
    task = TaskInfo("t", "pass", "cuda", need={"host": 300, "cuda": 400})
    (d,) = p.handle(TasksSubmitted((task,)))
    assert isinstance(d, Restrict) and d.resources == {"qf-memory-cuda": 400.0}
