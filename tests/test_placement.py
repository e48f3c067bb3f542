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
