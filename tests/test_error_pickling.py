"""Every error class of quantem-flow round-trips through pickle with its message and fields.

A cluster sends an error from a worker to the client by pickling it; one that cannot be
unpickled reaches the client as a bare ``Exception`` and loses its type.  The classes are
found, not listed: a new class (in ``quantem_flow.errors`` or anywhere in the package
that subclasses ``QuantemFlowError``) is covered without a new test.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from typing import Any

import pytest

import quantem_flow
from quantem_flow.errors import QuantemFlowError


def _all_error_classes() -> list[type[QuantemFlowError]]:
    for info in pkgutil.walk_packages(quantem_flow.__path__, "quantem_flow."):
        if info.name.startswith(("quantem_flow.runtimes.cuda", "quantem_flow.runtimes.mps")):
            continue  # device modules import CuPy/MLX lazily; their errors live in errors.py
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    seen: list[type[QuantemFlowError]] = []
    todo: list[type[QuantemFlowError]] = [QuantemFlowError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return sorted(seen, key=lambda c: (c.__module__, c.__qualname__))


CLASSES = _all_error_classes()


def _sample(name: str, annotation: Any) -> Any:
    text = str(annotation)
    if "int" in text and "str" not in text:
        return 7
    if "tuple" in text:
        return ("inner", "outer")
    return f"the {name}"


def _instance(cls: type[QuantemFlowError]) -> QuantemFlowError:
    """``cls("message", **every keyword field set to a sample value)``."""
    kwargs: dict[str, Any] = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = _sample(name, p.annotation)
    return cls(f"{cls.__name__}: expected x, got y; do z", **kwargs)


def test_the_hierarchy_is_found_whole() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"ExternalWorkerTimeoutError", "ProtocolError", "CorruptChunkError"} <= names
    assert len(CLASSES) >= 20


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_round_trips_through_pickle(cls: type[QuantemFlowError]) -> None:
    error = _instance(cls)
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert type(back) is cls
        assert str(back) == str(error) and back.args == error.args
        assert back.__dict__ == error.__dict__, (back.__dict__, error.__dict__)
        for base in cls.__mro__:  # still caught as every builtin it subclasses
            assert isinstance(back, base)


def test_a_timeout_reaches_a_dask_client_with_its_type_and_fields() -> None:
    from distributed.protocol import deserialize, serialize

    from quantem_flow.errors import ExternalWorkerTimeoutError

    error = ExternalWorkerTimeoutError(
        "no reply in 5 s", code="timeout", worker="swift", message_type="run", handle=3
    )
    back = deserialize(*serialize(error))
    assert type(back) is ExternalWorkerTimeoutError and isinstance(back, TimeoutError)
    assert (back.code, back.worker, back.message_type, back.handle) == (
        "timeout",
        "swift",
        "run",
        3,
    )
