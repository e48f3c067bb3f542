"""Fixtures of the external-worker tests: reference workers over pipes, cleaned up by PID."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

from quantem_flow.runtimes.external.transport import PipeConnection

REFERENCE = [sys.executable, "-m", "quantem_flow.runtimes.external.reference_worker"]


@pytest.fixture(autouse=True, scope="module")
def _registry_restored() -> Iterator[None]:
    """Runtimes a test module registers (external ones) leave with it, their workers closed."""
    from quantem_flow.runtimes.registry import instances, runtime_specs, unregister_runtime

    before = set(runtime_specs())
    yield
    for name in set(runtime_specs()) - before:
        runtime = instances().pop(name, None)
        close = getattr(runtime, "close", None)
        if callable(close):
            close()
        unregister_runtime(name)


@pytest.fixture
def pipes() -> Iterator[Callable[..., PipeConnection]]:
    """Start reference workers (``pipes("--budget-bytes", "100")``); all closed at the end."""
    made: list[PipeConnection] = []

    def start(*args: str, argv: list[str] | None = None) -> PipeConnection:
        conn = PipeConnection(argv or [*REFERENCE, *args], name="ref-test")
        made.append(conn)
        return conn

    yield start
    for conn in made:
        conn.close(timeout=2.0)
