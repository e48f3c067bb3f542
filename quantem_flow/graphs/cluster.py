"""The embedded local cluster (the default) and client helpers.

Every server binds to 127.0.0.1, the dashboard included (Dask binds it to
0.0.0.0 otherwise), and URLs are built from the bound sockets, never from
``dashboard_link``.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from .. import config

__all__ = ["close_embedded_cluster", "dashboard_url", "embedded_client", "start_local_cluster"]

_lock = threading.Lock()
_embedded: dict[str, Any] = {}


def start_local_cluster(
    *, n_workers: int | None = None, threads_per_worker: int | None = None, **kwargs: Any
) -> Any:
    """Start a ``distributed.LocalCluster`` bound to 127.0.0.1.

    Parameters
    ----------
    n_workers
        Worker processes (default ``config.get("local_workers")``).
    threads_per_worker
        Threads per worker (default ``config.get("local_threads")``).
    **kwargs
        Passed to :class:`distributed.LocalCluster`.

    Returns
    -------
    distributed.LocalCluster
        The running cluster.
    """
    from distributed import LocalCluster

    options: dict[str, Any] = {
        "n_workers": int(n_workers or config.get("local_workers")),
        "threads_per_worker": int(threads_per_worker or config.get("local_threads")),
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": 40,
    }
    options.update(kwargs)
    return LocalCluster(**options)


def embedded_client() -> Any:
    """Return the client of this process's embedded local cluster, starting it once."""
    from distributed import Client

    with _lock:
        client = _embedded.get("client")
        if client is not None and client.status == "running":
            return client
        cluster = start_local_cluster()
        client = Client(cluster, set_as_default=False)
        _embedded.update(cluster=cluster, client=client)
        return client


def close_embedded_cluster() -> None:
    """Close the embedded cluster if it runs."""
    with _lock:
        client = _embedded.pop("client", None)
        cluster = _embedded.pop("cluster", None)
    if client is not None:
        client.close()
    if cluster is not None:
        cluster.close()


atexit.register(close_embedded_cluster)


def dashboard_url(client: Any) -> str | None:
    """Return the dashboard URL of a client's scheduler built from the bound socket."""
    info = client.scheduler_info()
    port = info.get("services", {}).get("dashboard")
    if port is None:
        return None
    addr = str(info.get("address", ""))
    host = addr.split("://", 1)[-1].rsplit(":", 1)[0] or "127.0.0.1"
    return f"http://{host}:{port}/status"
