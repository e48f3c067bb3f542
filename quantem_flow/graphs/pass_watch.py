"""What the scheduler's placement plugin tells a client about its passes, as it happens.

The plugin (:mod:`~quantem_flow.graphs.scheduler_plugin`) registers every
pass when its graph arrives (the ``qf_pass`` annotation of its spec or
dataset layer) and records every worker that leaves.  It publishes both on
the scheduler event topic :data:`~quantem_flow.graphs.scheduler_plugin.PASS_EVENTS_TOPIC`:
``{"pass": name, "cursor": seq}`` (the departures' sequence number when
the pass arrived) and ``{"departure": record}`` (again when the record
changes: restored, a restart report).  A :class:`PassWatch` subscribed to
the topic keeps them, so after a pass the runner reads the workers lost
during it here, with no request to the scheduler.

Ordering makes this exact: the scheduler sends events and "key in memory"
messages to a client over one stream, in order, and the client handles
them in order, so by the time a pass's result is in memory on the client
its registration and every departure recorded before the result have been
handled.  Before this (issue 24, goal 5) the runner asked the scheduler
twice per pass (``run_on_scheduler``: register, then departures), 2-3 ms of
a pass's fixed cost on the embedded default.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["PassWatch", "pass_watch"]


class PassWatch:
    """Pass cursors and departures the scheduler's plugin published to one client."""

    #: Departures kept (the plugin keeps as many).
    MAX_DEPARTURES = 500
    #: Pass cursors kept.
    MAX_PASSES = 1000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cursors: dict[str, int] = {}
        self._departures: dict[int, dict[str, Any]] = {}

    def handle(self, event: Any) -> None:
        """Take one event ``(timestamp, msg)`` of the topic (the client's handler)."""
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event
        if not isinstance(msg, dict):
            return
        with self._lock:
            if "pass" in msg and "cursor" in msg:
                self._cursors[str(msg["pass"])] = int(msg["cursor"])
                while len(self._cursors) > self.MAX_PASSES:
                    del self._cursors[next(iter(self._cursors))]
            elif isinstance(msg.get("departure"), dict) and "seq" in msg["departure"]:
                record = dict(msg["departure"])
                self._departures[int(record["seq"])] = record
                while len(self._departures) > self.MAX_DEPARTURES:
                    del self._departures[min(self._departures)]

    def cursor(self, name: str) -> int | None:
        """The departures' sequence number when pass ``name`` arrived; ``None``: not heard of."""
        with self._lock:
            return self._cursors.get(name)

    def latest(self) -> int:
        """Sequence number of the last departure heard of; -1 before any."""
        with self._lock:
            return max(self._departures, default=-1)

    def departures(self, names: list[str]) -> list[dict[str, Any]] | None:
        """Departures since the earliest of the passes ``names`` arrived, in order.

        Returns
        -------
        list of dict or None
            The plugin's departure records (see
            :meth:`~quantem_flow.graphs.scheduler_plugin.PlacementSchedulerPlugin.departures_since`);
            ``None`` when no pass of ``names`` was registered (no plugin on the scheduler).
        """
        with self._lock:
            cursors = [self._cursors[n] for n in names if n in self._cursors]
            if not cursors:
                return None
            first = min(cursors)
            return [dict(self._departures[s]) for s in sorted(self._departures) if s >= first]


_watches: weakref.WeakKeyDictionary[Any, PassWatch] = weakref.WeakKeyDictionary()
_watches_lock = threading.Lock()


def pass_watch(client: Any) -> PassWatch:
    """The :class:`PassWatch` of ``client``, subscribed to the plugin's topic at first use.

    The subscription goes out on the client's stream to the scheduler ahead
    of any graph submitted after this call, so the scheduler subscribes the
    client before it registers that graph's passes.
    """
    from .scheduler_plugin import PASS_EVENTS_TOPIC

    with _watches_lock:
        watch = _watches.get(client)
        if watch is None:
            watch = PassWatch()
            client.subscribe_topic(PASS_EVENTS_TOPIC, watch.handle)
            _watches[client] = watch
        return watch
