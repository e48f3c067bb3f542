"""Start-up and first passes of the embedded local cluster: worker programs vs spawned nannies.

Each repeat runs in a fresh interpreter (``--child``) and measures

* ``start_s``: creating the cluster and its client until every worker has
  registered;
* ``pass1_s``: the first ``qf.compute(bf, adf, com)`` over a small synthetic
  dataset (includes the workers' first imports and kernel compilation);
* ``pass2_s``: the same computation again (steady state): the median of
  ``--passes`` further passes (one pass of ~0.2 s is too noisy on a shared
  VM to compare modes);
* ``total_s``: interpreter start to the end of the first two passes, as a
  user waits.

Modes: ``program`` is the default since issue 12 (each worker is
``python -m quantem_flow.graphs.local_worker``, started as a program of its
own); ``nanny`` is the previous default (``distributed.LocalCluster`` with
``Nanny`` workers spawned through ``multiprocessing``, which re-imports the
caller's ``__main__``); ``default`` is the embedded default as configured
(``local_workers`` x ``local_threads``); ``program@WxT`` is W worker
programs of T threads each (issue 14: 1x2 vs 2x1).

    python benchmarks/embedded_startup.py --repeats 5
    python benchmarks/embedded_startup.py --repeats 5 --modes default,program@1x2,program@2x1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

T0 = time.perf_counter()


def _child(mode: str, workers: int, passes: int) -> dict[str, float]:
    """One repeat; ``mode`` is ``program``, ``nanny``, ``default`` or ``program@WxT``."""
    threads = 1
    if "@" in mode:
        mode, layout = mode.split("@")
        workers, threads = (int(x) for x in layout.split("x"))
    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    data, _ = qf.synthetic_dataset(scan_shape=(64, 64), detector_shape=(64, 64))
    ds = qf.open(data, chunk_mib=4)
    t = time.perf_counter()
    if mode == "default":  # the embedded default as configured (issue 14)
        client = qc.embedded_client()
        workers = len(client.scheduler_info()["workers"])
    elif mode == "program":
        with qf.config.set(local_workers=workers, local_threads=threads):
            client = qc.embedded_client()
    else:
        from distributed import Client, LocalCluster

        from quantem_flow.graphs.worker import worker_options

        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            silence_logs=40,
            **worker_options(memory_limit=qc._memory_share("auto", 1, workers), nthreads=1),
        )
        client = Client(cluster, set_as_default=False)
    start = time.perf_counter() - t
    out = {"start_s": start}
    steady: list[float] = []
    for i in range(1 + passes):
        t = time.perf_counter()
        qf.compute(
            qf.virtual_bf(ds),
            qf.virtual_adf(ds),
            qf.center_of_mass(ds),
            client=client,
            progress=False,
        )
        dt = time.perf_counter() - t
        if i == 0:
            out["pass1_s"] = dt
        else:
            steady.append(dt)
        if i == 1:
            out["total_s"] = time.perf_counter() - T0
    out["pass2_s"] = statistics.median(steady)
    n = len(client.scheduler_info()["workers"])
    assert n == workers, f"{n} workers registered, expected {workers}"
    client.close()
    if mode in ("program", "default"):
        qc.close_embedded_cluster()
    else:
        cluster.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", default="program,nanny")
    p.add_argument("--passes", type=int, default=7, help="steady-state passes per repeat")
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.workers, args.passes)))
        return
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes.split(",")}
    for _ in range(args.repeats):
        for mode in runs:  # interleaved, so drifting load hits both modes alike
            t = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--workers",
                    str(args.workers),
                    "--passes",
                    str(args.passes),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            rec["wall_s"] = time.perf_counter() - t
            runs[mode].append(rec)
    summary = {
        mode: {k: round(statistics.median(r[k] for r in recs), 3) for k in recs[0]}
        for mode, recs in runs.items()
    }
    print(json.dumps({"repeats": args.repeats, "workers": args.workers, "median": summary}))


if __name__ == "__main__":
    main()
