"""One worker of the embedded local cluster, run as a program of its own.

``python -m quantem_flow.graphs.local_worker SPEC_JSON`` starts a quantem-flow
``distributed.Worker`` (its runtimes advertised before it registers, device
payloads kept out of spill-to-disk) connected to the scheduler named in the
spec, prints one JSON line ``{"address": ..., "pid": ...}`` once it has
registered, and runs until the scheduler closes it, it receives SIGTERM or
SIGINT, or the process that started it exits.

Being a program of its own (not a ``multiprocessing`` child) it never
re-imports the caller's ``__main__``: the embedded default works from a
script without ``if __name__ == "__main__":``, from code piped on stdin, in
a REPL and in a Jupyter kernel.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["SPEC_KEYS", "main"]

#: Keys of the JSON spec.
SPEC_KEYS = (
    "scheduler",
    "name",
    "nthreads",
    "memory_limit",
    "runtimes",
    "budget_fraction",
    "budgets",
    "resources",
    "host",
    "parent_pid",
    "local_directory",
    "silence_logs",
    "batch_interval_s",
)
PARENT_POLL_S = 1.0


async def _serve(spec: Mapping[str, Any]) -> None:
    from distributed import Worker

    from .worker import DEFAULT_BUDGET_FRACTION, worker_options

    level = int(spec.get("silence_logs") or 0)
    if level:
        import logging

        logging.getLogger("distributed").setLevel(level)
    nthreads = int(spec.get("nthreads", 1))
    options = worker_options(
        runtimes=spec.get("runtimes"),
        budget_fraction=float(spec.get("budget_fraction", DEFAULT_BUDGET_FRACTION)),
        budgets=spec.get("budgets"),
        memory_limit=spec.get("memory_limit"),
        nthreads=nthreads,
        batch_interval_s=(
            None if spec.get("batch_interval_s") is None else float(spec["batch_interval_s"])
        ),
    )
    if spec.get("resources"):
        options["resources"] = dict(spec["resources"])
    if spec.get("local_directory"):
        options["local_directory"] = str(spec["local_directory"])
    host = str(spec.get("host", "127.0.0.1"))
    worker = Worker(
        str(spec["scheduler"]),
        name=spec.get("name"),
        nthreads=nthreads,
        host=host,
        dashboard_address=f"{host}:0",
        **options,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = int(spec.get("parent_pid") or os.getppid())

    async def watch_parent() -> None:
        while not stop.is_set():
            if os.getppid() != parent:  # the parent exited: we were re-parented
                stop.set()
            await asyncio.sleep(PARENT_POLL_S)

    async with worker:
        print(json.dumps({"address": worker.address, "pid": os.getpid()}), flush=True)
        watcher = asyncio.create_task(watch_parent())
        finished = asyncio.create_task(worker.finished())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({finished, stopped}, return_when=asyncio.FIRST_COMPLETED)
        watcher.cancel()
        stopped.cancel()
        if not finished.done():
            await worker.close(reason="quantem-flow local worker asked to stop")
            finished.cancel()


def main(argv: list[str] | None = None) -> int:
    """Run one worker from the JSON spec in ``argv[0]`` (see the module docstring).

    Parameters
    ----------
    argv
        ``[SPEC_JSON]`` (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status (2 for a malformed spec).
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m quantem_flow.graphs.local_worker SPEC_JSON", file=sys.stderr)
        return 2
    try:
        spec = json.loads(args[0])
    except json.JSONDecodeError as exc:
        print(f"local_worker: the spec is not JSON: {exc}", file=sys.stderr)
        return 2
    unknown = sorted(set(spec) - set(SPEC_KEYS)) if isinstance(spec, dict) else []
    if not isinstance(spec, dict) or "scheduler" not in spec or unknown:
        print(
            f"local_worker: the spec needs 'scheduler' and keys among {list(SPEC_KEYS)}; "
            f"unknown: {unknown}",
            file=sys.stderr,
        )
        return 2
    asyncio.run(_serve(spec))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a program
    sys.exit(main())
