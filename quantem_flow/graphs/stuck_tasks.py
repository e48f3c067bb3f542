"""Tasks that no worker can run fail promptly with the project's error, never wait forever.

A quantem-flow task waits in the scheduler's ``no-worker`` state when no connected
worker can run it.  That is right while a worker is coming (the local cluster restarting
a killed worker, a Nanny, a worker the user is starting) and wrong when none will: the
local cluster's supervisor gave up on a worker that kept dying, or the workers that exist
lack the runtime, budget or memory the task needs.  :class:`StuckTasks` keeps what the
scheduler plugin learns about workers (each departure with the memory the worker reported
last, each restart report with its exit statuses) and decides, on every check, which
waiting tasks to fail and with what reason:

* a task placement refused (no capable worker, a memory need beyond every budget) fails
  at once with the refusal: with no worker at all its refusal could not even run;
* with no worker left and none being restarted, after a worker program gave up or failed
  to restart: at once, with the workers' exit history and what to do;
* otherwise, once it has waited :attr:`StuckTasks.timeout_s` seconds (``qf.config``
  ``no_worker_timeout_s``, ``QUANTEM_FLOW_NO_WORKER_TIMEOUT_S``): with what it needs and
  what the workers offer.

The class is a pure state machine over plain values, tested without a cluster; the
plugin feeds it and applies its verdicts (``scheduler.transition(key, "erred", ...)``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Exit", "StuckTasks", "Verdict", "WorkerRecord"]


@dataclasses.dataclass
class Exit:
    """One unexpected end of a worker: when, its status, the memory it reported last."""

    time: float
    status: int | None = None
    memory_bytes: int | None = None
    memory_limit: int | None = None

    def describe(self) -> str:
        """``"17:01:02 killed by signal 9, 182 MiB at its last heartbeat of a 2048 MiB limit"``."""
        when = time.strftime("%H:%M:%S", time.localtime(self.time))
        if self.status is None:
            what = "left without closing"
        elif self.status < 0:
            what = f"killed by signal {-self.status}"
        else:
            what = f"exit status {self.status}"
        memory = ""
        if self.memory_bytes is not None:
            memory = f", {self.memory_bytes / 2**20:.0f} MiB at its last heartbeat"
            if self.memory_limit:
                memory += f" of a {self.memory_limit / 2**20:.0f} MiB limit"
        return f"{when} {what}{memory}"


@dataclasses.dataclass
class WorkerRecord:
    """What is known of one worker (by name): how it ended each time, whether it comes back.

    The scheduler sees each loss (a departure, with the memory the worker reported at its
    last heartbeat); a restart supervisor reports each exit status.  Both come once per
    death, in order, so the i-th status belongs to the i-th departure.
    """

    name: str
    #: ``"running"``, ``"lost"`` (left; nothing reported yet), ``"restarting"``,
    #: ``"gave-up"`` or ``"failed"`` (the restart itself failed)
    state: str = "running"
    departures: list[Exit] = dataclasses.field(default_factory=list)
    statuses: list[tuple[float, int | None]] = dataclasses.field(default_factory=list)
    detail: str = ""

    @property
    def exits(self) -> list[Exit]:
        """Each death: the departure's time and memory with the supervisor's status."""
        out = [dataclasses.replace(d) for d in self.departures]
        for i, (when, status) in enumerate(self.statuses):
            if i < len(out):
                out[i].status = status
            else:
                out.append(Exit(when, status))
        return out

    def history(self) -> str:
        """The worker's exits and state, for people."""
        exits = "; ".join(e.describe() for e in self.exits) or "none recorded"
        state = {
            "gave-up": "the local cluster stopped restarting it",
            "failed": "restarting it failed",
            "restarting": "it is being restarted",
            "lost": "it left without closing",
            "running": "running",
        }.get(self.state, self.state)
        why = f" ({self.detail})" if self.detail and self.state in ("gave-up", "failed") else ""
        return f"worker {self.name!r}: {len(self.exits)} exit(s): {exits}; {state}{why}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Tasks to fail now, and the reason the client reads."""

    keys: tuple[Any, ...]
    reason: str


def _what_to_do(records: Iterable[WorkerRecord]) -> str:
    near_limit = any(
        e.memory_bytes is not None and e.memory_limit and e.memory_bytes > 0.8 * e.memory_limit
        for r in records
        for e in r.exits
    )
    advice = (
        "Find why the workers died: "
        + (
            "the memory at their last heartbeat was near their limit, so give workers more "
            "memory (start_local_cluster(memory_limit=...)) or use smaller chunks "
            "(qf.config chunk_mib); "
            if near_limit
            else "a signal means something killed them (the OOM killer, a person); a non-zero "
            "status is a crash (the worker's log says more); "
        )
        + "then start a new cluster (qf.close_embedded_cluster() makes the next compute start a "
        "fresh embedded one) or add workers that can run the tasks"
    )
    return advice


class StuckTasks:
    """Decide which waiting quantem-flow tasks to fail (see the module docstring).

    Parameters
    ----------
    timeout_s
        Seconds a task may wait for a worker when one may still come.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.workers: dict[str, WorkerRecord] = {}
        #: address -> (memory bytes at the last heartbeat, memory limit)
        self.memory: dict[str, tuple[int | None, int | None]] = {}
        self._names: dict[str, str] = {}

    # -- what the plugin tells it --------------------------------------------------------
    def _record(self, name: str) -> WorkerRecord:
        record = self.workers.get(name)
        if record is None:
            record = self.workers[name] = WorkerRecord(name)
        return record

    def joined(self, address: str, name: str) -> None:
        """A worker registered (a restart of ``name`` brings it back)."""
        self._record(name).state = "running"
        self._names[address] = name

    def heartbeat(self, address: str, memory_bytes: int | None, memory_limit: int | None) -> None:
        """The memory a worker reported last (kept for its exit history)."""
        self.memory[address] = (memory_bytes, memory_limit)

    def left(self, address: str, name: str | None, *, lost: bool, now: float | None = None) -> None:
        """A worker left; a loss joins its history with the memory it reported last."""
        name = name or self._names.get(address) or address
        self._names.pop(address, None)
        memory, limit = self.memory.pop(address, (None, None))
        if not lost:
            self.workers.pop(name, None)  # closed on purpose: not coming back, not stuck
            return
        record = self._record(name)
        if record.state == "running":
            record.state = "lost"
        record.departures.append(Exit(now or time.time(), None, memory, limit))

    def report(
        self,
        name: str,
        restart: str,
        detail: str,
        exits: Iterable[tuple[float, int | None]] = (),
    ) -> None:
        """A restart supervisor's report (``restarting``, ``gave-up``, ``failed``) and its exits."""
        record = self._record(name)
        if not (restart == "restarting" and record.state == "running"):
            record.state = restart  # (a late "restarting" after the worker rejoined: running)
        record.detail = detail
        reported = [(float(t), None if s is None else int(s)) for t, s in exits]
        if len(reported) >= len(record.statuses):
            record.statuses = reported

    # -- the decision -----------------------------------------------------------------------
    def check(
        self,
        waiting: Mapping[Any, float],
        *,
        refused: Mapping[Any, str],
        n_workers: int,
        offered: str,
        needs: Mapping[Any, str],
        now: float,
    ) -> list[Verdict]:
        """Which of the ``waiting`` tasks to fail now.

        Parameters
        ----------
        waiting
            Quantem-flow tasks in ``no-worker``, with the monotonic time they started
            waiting.
        refused
            Placement's refusal reason of tasks it refused.
        n_workers
            Workers connected now.
        offered
            What the connected workers offer, for the message.
        needs
            What each waiting task needs (runtime, memory), for the message.
        now
            The monotonic time now.
        """
        if not waiting:
            return []
        verdicts: list[Verdict] = []
        refusals = [k for k in waiting if k in refused]
        for reason in sorted({refused[k] for k in refusals}):
            verdicts.append(Verdict(tuple(k for k in refusals if refused[k] == reason), reason))
        rest = [k for k in waiting if k not in refused]
        if not rest:
            return verdicts
        records = list(self.workers.values())
        coming = [r for r in records if r.state in ("restarting", "lost", "running")]
        gone = [r for r in records if r.state in ("gave-up", "failed")]
        history = "; ".join(r.history() for r in records if r.exits or r.state != "running")
        if n_workers == 0 and gone and not coming:
            verdicts.append(
                Verdict(
                    tuple(rest),
                    f"no worker can run {len(rest)} quantem-flow task(s): the cluster has no "
                    f"worker left and none is being restarted. {history}. {_what_to_do(gone)}",
                )
            )
            return verdicts
        late = [k for k in rest if now - waiting[k] >= self.timeout_s]
        if late:
            need = "; ".join(sorted({needs.get(k, "any worker") for k in late}))
            if n_workers == 0:
                where = "the cluster has no worker"
            else:
                where = f"the {n_workers} connected worker(s) offer {offered}"
            verdicts.append(
                Verdict(
                    tuple(late),
                    f"no worker could run {len(late)} quantem-flow task(s) for "
                    f"{self.timeout_s:.0f} s (qf.config no_worker_timeout_s): they need {need}; "
                    f"{where}." + (f" {history}." if history else "") + " Start a worker that "
                    "can run them (quantem-flow worker SCHEDULER --runtimes ...), give workers "
                    "more memory or use smaller chunks, or raise no_worker_timeout_s if workers "
                    "are on their way",
                )
            )
        return verdicts
