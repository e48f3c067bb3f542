"""Runtime adapters, their registry and the choice of a runtime.

Every runtime is declared once by a :class:`RuntimeSpec` (see
:mod:`quantem_flow.runtimes.registry`): the built-in ``cpu``, ``cuda`` and
``mps``, those installed distributions declare in the entry-point group
``quantem_flow.runtimes``, and those registered in process with
:func:`register_runtime`.  Listing them never imports CuPy or MLX.

``backend="auto"`` picks the first of :func:`auto_order` that is available
and declares the kernel asked for (operation, representation, dtype); an
explicit runtime that is unavailable raises
:class:`~quantem_flow.errors.RuntimeUnavailableError`, and one that lacks the
kernel raises :class:`~quantem_flow.errors.UnsupportedOperationError`, each
naming the runtimes that would do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import ParameterError, RuntimeUnavailableError, UnsupportedOperationError
from .base import FramePassResult, Precision, Runtime
from .registry import (
    ENTRY_POINT_GROUP,
    ProbeResult,
    RuntimeRegistryWarning,
    RuntimeSpec,
    auto_order,
    clear_registry_cache,
    dtype_name,
    entry_point_errors,
    factory_of,
    get_spec,
    instances,
    manifest,
    probe_runtime,
    register_runtime,
    runtime_specs,
    unregister_runtime,
)

__all__ = [
    "AUTO_ORDER",
    "ENTRY_POINT_GROUP",
    "MANIFEST",
    "BackendChoice",
    "FramePassResult",
    "Precision",
    "ProbeResult",
    "Runtime",
    "RuntimeRegistryWarning",
    "RuntimeSpec",
    "auto_order",
    "available_runtimes",
    "clear_registry_cache",
    "entry_point_errors",
    "get_runtime",
    "get_spec",
    "manifest",
    "probe_runtime",
    "register_runtime",
    "resolve_backend",
    "runtime_specs",
    "runtimes_supporting",
    "unregister_runtime",
]


class _ManifestView(Mapping[str, dict[str, Any]]):
    """``{name: declaration dict}`` of every registered runtime, derived on each access."""

    def __getitem__(self, name: str) -> dict[str, Any]:
        return manifest()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(runtime_specs())

    def __len__(self) -> int:
        return len(runtime_specs())

    def __repr__(self) -> str:
        return f"MANIFEST({sorted(runtime_specs())})"


#: A live view of the declarations: ``{name: RuntimeSpec.to_dict()}``.
MANIFEST: Mapping[str, dict[str, Any]] = _ManifestView()


def __getattr__(name: str) -> Any:
    if name == "AUTO_ORDER":  # derived from the declarations on each access
        return auto_order()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _factory(name: str) -> Any:
    spec = get_spec(name)
    try:
        return factory_of(spec)
    except ImportError as exc:
        raise RuntimeUnavailableError(
            f"runtime {name!r} ({spec.origin}) cannot be imported ({exc}); install what it needs"
            + (f" ({spec.dependency})" if spec.dependency else "")
        ) from exc


def _available(name: str) -> tuple[bool, str]:
    try:
        cls = _factory(name)
        check = getattr(cls, "available", None)
        if not callable(check):
            return True, "declares no availability check"
        ok, why = check()
    except (ImportError, RuntimeUnavailableError) as exc:
        return False, f"import failed: {exc}"
    return bool(ok), str(why)


def _auto_excluded(name: str) -> str | None:
    try:
        check = getattr(_factory(name), "auto_excluded", None)
        return check() if callable(check) else None
    except (ImportError, RuntimeUnavailableError, AttributeError):
        return None  # _available reports why the runtime cannot be used


def _auto_verdict(name: str) -> tuple[str, str] | None:
    """Why ``backend="auto"`` passes over ``name``, cheapest check first; ``None``: it may run.

    ``("skipped", reason)`` when the runtime excludes itself at no cost
    (:meth:`~quantem_flow.runtimes.base.Runtime.auto_excluded`) or is not
    worth choosing unasked; ``("absent", reason)`` when it does not run here.
    """
    excluded = _auto_excluded(name)
    if excluded:
        return "skipped", excluded
    ok, why = _available(name)
    if not ok:
        return "absent", why
    eligible, reason = _factory(name).auto_eligible()
    return None if eligible else ("skipped", reason)


def available_runtimes() -> dict[str, str]:
    """Return ``{name: reason}`` for every registered runtime that can run here."""
    out: dict[str, str] = {}
    for name in runtime_specs():
        ok, why = _available(name)
        if ok:
            out[name] = why
    return out


def get_runtime(name: str) -> Runtime:
    """Return the (cached) runtime instance ``name``, or raise if unavailable.

    Raises
    ------
    RuntimeUnavailableError
        ``name`` is not registered, or does not run here; the message names
        the runtimes that do.
    """
    cache = instances()
    if name in cache:
        return cache[name]
    cls = _factory(name)
    ok, why = _available(name)
    if not ok:
        raise RuntimeUnavailableError(
            f"runtime {name!r} is not available here ({why}); available: "
            f"{sorted(available_runtimes())}. Choose one of those or backend='auto'"
        )
    runtime = cls()
    if not isinstance(runtime, Runtime):
        raise RuntimeUnavailableError(
            f"the factory {get_spec(name).factory} of runtime {name!r} made a "
            f"{type(runtime).__name__}, not a quantem_flow.runtimes.Runtime"
        )
    if runtime.name != name:
        raise RuntimeUnavailableError(
            f"the factory {get_spec(name).factory} of runtime {name!r} made a runtime named "
            f"{runtime.name!r}; a runtime's class must carry the name it is declared under"
        )
    cache[name] = runtime
    return runtime


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """Which runtime a computation uses and why (recorded in provenance)."""

    requested: str
    chosen: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-ready dict."""
        return dataclasses.asdict(self)


def _wanted(
    operation: str | Sequence[str], representation: str, dtype: Any
) -> tuple[tuple[str, ...], str | None]:
    ops = (operation,) if isinstance(operation, str) else tuple(operation)
    if not ops or not all(isinstance(o, str) for o in ops):
        raise ParameterError(f"operation must be a name or names, got {operation!r}")
    try:
        name = None if dtype is None else dtype_name(dtype)
    except TypeError as exc:
        raise ParameterError(f"dtype must be a NumPy dtype or None, got {dtype!r}") from exc
    return ops, name


def _describe_kernel(ops: tuple[str, ...], representation: str, dtype: str | None) -> str:
    what = " and ".join(repr(o) for o in ops)
    return f"{what} on {representation!r}" + (f" {dtype}" if dtype else "")


def _lacking(
    spec: RuntimeSpec, ops: tuple[str, ...], representation: str, dtype: str | None
) -> list[str]:
    return [op for op in ops if not spec.supports(op, representation, dtype)]


def runtimes_supporting(
    operation: str | Sequence[str], representation: str, dtype: Any = None
) -> list[str]:
    """Registered runtimes that declare every operation on ``representation`` (and ``dtype``)."""
    ops, name = _wanted(operation, representation, dtype)
    return [n for n, s in runtime_specs().items() if not _lacking(s, ops, representation, name)]


def resolve_backend(
    backend: str,
    *,
    operation: str | Sequence[str] = "frame_pass",
    representation: str = "dense",
    dtype: Any = None,
    allow_complex64: bool = False,
) -> BackendChoice:
    """Choose the runtime for ``backend`` (``"auto"`` or a registered runtime name).

    Parameters
    ----------
    backend
        ``"auto"`` or a runtime name.
    operation
        The operation (or operations, all required) the runtime must run;
        ``"ssb"``: the SSB FFT stage, on the gathered bright field (a runtime
        with an array adapter, :mod:`quantem_flow.runtimes.array_ops`).
    representation
        The payload representation (``"ssb"`` always runs on ``"gathered"``).
    dtype
        The data's dtype (the dataset's); ``None`` accepts any dtype the
        runtime declares for the operation.
    allow_complex64
        For ``"ssb"``: allow an adapter without a complex128 FFT (MLX).

    Returns
    -------
    BackendChoice
        The requested and chosen names and the reason.

    Raises
    ------
    RuntimeUnavailableError
        An explicit runtime is unknown or not available here, or no runtime
        is eligible for ``"auto"``; the message names those that are.
    UnsupportedOperationError
        An explicit runtime declares no kernel for the operation on the
        representation and dtype; the message names the runtimes that do.
    """
    if not isinstance(backend, str):
        raise ParameterError(
            f"backend must be a string ('auto' or a runtime name), got {backend!r}"
        )
    if operation == "ssb":
        from .array_ops import resolve_ssb_backend

        return resolve_ssb_backend(backend, allow_complex64=allow_complex64, dtype=dtype)
    ops, dt = _wanted(operation, representation, dtype)
    kernel = _describe_kernel(ops, representation, dt)
    if backend == "auto":
        order = auto_order()
        specs = runtime_specs()
        not_here: list[str] = []
        passed_over: list[str] = []
        for name in order:
            lacking = _lacking(specs[name], ops, representation, dt)
            if lacking:
                passed_over.append(
                    f"{name} (no {_describe_kernel(tuple(lacking), representation, dt)} kernel)"
                )
                continue
            verdict = _auto_verdict(name)
            if verdict is not None:
                if verdict[0] == "absent":
                    not_here.append(name)
                else:
                    passed_over.append(f"{name} ({verdict[1]})")
                continue
            why = f"first available of {list(order)}"
            if not_here:
                why += f"; not available here: {not_here}"
            if passed_over:
                why += "; skipped by auto: " + "; ".join(passed_over)
            return BackendChoice("auto", name, why)
        raise RuntimeUnavailableError(
            f"no runtime here can run {kernel} by backend='auto'; available: "
            f"{sorted(available_runtimes())}; runtimes declaring it: "
            f"{runtimes_supporting(ops, representation, dt)}"
            + (f"; skipped by auto: {'; '.join(passed_over)}" if passed_over else "")
        )
    spec = get_spec(backend)  # RuntimeUnavailableError for an unknown name
    lacking = _lacking(spec, ops, representation, dt)
    if lacking:
        able = runtimes_supporting(ops, representation, dt)
        offered = spec.dtypes(lacking[0], representation)
        missing = _describe_kernel(tuple(lacking), representation, dt)
        raise UnsupportedOperationError(
            f"runtime {backend!r} has no kernel for {missing}"
            + (
                f" (it offers {lacking[0]!r} on {representation!r} for {list(offered)})"
                if offered
                else ""
            )
            + f"; runtimes that do: {able}. Choose one of those, backend='auto', or convert "
            "the data explicitly"
        )
    get_runtime(backend)  # RuntimeUnavailableError naming those available
    return BackendChoice(backend, backend, "requested explicitly")
