"""Waiting on a condition with a deadline: every wait in a live acquisition has one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(
    condition: threading.Condition,
    done: Callable[[], bool],
    timeout_s: float,
    *,
    on_timeout: Callable[[], BaseException] | None = None,
    check: Callable[[], None] | None = None,
) -> bool:
    """Wait, holding ``condition``, until ``done()`` or ``timeout_s`` passed.

    Parameters
    ----------
    condition
        Held by the caller; notified when what ``done`` reads changes.
    done
        What is awaited (read under the lock).
    timeout_s
        The deadline, in seconds from now.
    on_timeout
        The error to raise at the deadline; ``None`` returns ``False`` instead.
    check
        Called on every wake-up (under the lock), to raise what stopped the
        wait early (an error recorded by another thread).

    Returns
    -------
    bool
        Whether ``done()`` became true.
    """
    deadline = time.monotonic() + timeout_s
    while not done():
        if check is not None:
            check()
        left = deadline - time.monotonic()
        if left <= 0:
            if on_timeout is not None:
                raise on_timeout()
            return False
        condition.wait(min(left, 0.5))
    return True
