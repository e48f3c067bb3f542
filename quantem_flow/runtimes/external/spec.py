"""Declarations of the ``webgpu`` and ``webgpu-browser`` runtimes (cheap to import).

Both run the WebGPU/WGSL worker of ``web/`` (one source, two hosts) through
the ``qf-worker/1`` bridge: ``webgpu`` as ``node web/dist/node-worker.js``
over pipes, ``webgpu-browser`` as a page in a browser over a loopback
WebSocket.  The kernels below are what the worker offers (its ``hello`` is
authoritative at run time).  Neither is chosen by ``backend="auto"``: they
are CPU emulations here (SwiftShader, Mesa) and an explicit choice anywhere.
"""

from __future__ import annotations

from ..dtypes import triples
from ..registry import RuntimeSpec

__all__ = [
    "EXTERNAL_SPECS",
    "HELLO_DECLARED",
    "KERNELS",
    "VULKAN_KERNELS",
    "VULKAN_SPEC",
    "WEBGPU_BROWSER_SPEC",
    "WEBGPU_SPEC",
    "kernel_triples",
    "reference_spec",
    "register_requested",
    "why_not_registered",
]


def kernel_triples(
    dense: tuple[str, ...], counted: tuple[str, ...]
) -> frozenset[tuple[str, str, str]]:
    """(operation, representation, dtype) of frame_pass and gather on these dtypes."""
    return frozenset().union(
        *(
            triples(op, "dense", dense) | triples(op, rep, counted)
            for op in ("frame_pass", "gather")
            for rep in ("paired", "packed")
        )
    )


def _external(
    name: str, runtime: str, probe: str, kernels: frozenset[tuple[str, str, str]], description: str
) -> RuntimeSpec:
    return RuntimeSpec(
        name=name,
        factory=runtime,
        dependency=None,
        kernels=kernels,
        auto_rank=None,
        probe=probe,
        residency="external",
        description=description,
    )


_WORKERS = "quantem_flow.runtimes.external.workers"

#: ``(operation, representation, dtype)`` of the WebGPU worker.
KERNELS = kernel_triples(
    ("uint8", "uint16", "uint32", "float32"),
    ("uint8", "uint16", "uint32", "int8", "int16", "int32"),
)
#: ``(operation, representation, dtype)`` of ``qf-vulkan-worker`` (its hello is authoritative).
VULKAN_KERNELS = kernel_triples(
    ("uint8", "uint16", "uint32", "float32"), ("uint8", "uint16", "uint32")
)

WEBGPU_SPEC = _external(
    "webgpu",
    f"{_WORKERS}:WebGpuNodeRuntime",
    f"{_WORKERS}:probe_webgpu",
    KERNELS,
    "WebGPU/WGSL worker (web/) on Node + Dawn, over pipes (qf-worker/1)",
)
WEBGPU_BROWSER_SPEC = _external(
    "webgpu-browser",
    f"{_WORKERS}:WebGpuBrowserRuntime",
    f"{_WORKERS}:probe_webgpu_browser",
    KERNELS,
    "WebGPU/WGSL worker (web/) in a browser page over a loopback WebSocket (qf-worker/1)",
)


def reference_spec() -> RuntimeSpec:
    """The ``external-reference`` declaration, its kernels those its worker's ``hello`` declares.

    The reference worker is Python: its ``hello`` is asked of a worker made in
    this process (no child started), so the row cannot disagree with it.
    """
    from .reference_worker import ReferenceWorker

    hello = ReferenceWorker().hello().header
    return _external(
        "external-reference",
        f"{_WORKERS}:ReferenceRuntime",
        f"{_WORKERS}:probe_reference",
        frozenset((str(op), str(rep), str(dt)) for op, rep, dt in hello["kernels"]),
        "the NumPy reference qf-worker/1 worker in a child process (tests, CI without Node; "
        "$QF_REFERENCE_WORKER_ARGS adds arguments)",
    )


def __getattr__(name: str) -> RuntimeSpec:
    if name == "REFERENCE_SPEC":  # made from the worker's hello on first use
        return reference_spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


VULKAN_SPEC = _external(
    "vulkan",
    "quantem_flow.runtimes.external.vulkan:VulkanRuntime",
    "quantem_flow.runtimes.external.vulkan:probe_vulkan",
    VULKAN_KERNELS,
    "C++/Vulkan worker (android/, host build) over pipes (qf-worker/1)",
)

#: The external runtimes declared here, registered on demand (see :func:`register_requested`).
#: Their workers' hello is authoritative at run time (the bridge refuses what it does not
#: offer); asking it at registration needs a started worker, which ``webgpu`` cannot be here
#: (its build needs npm) and ``vulkan``'s executable has no hello-only mode.
EXTERNAL_SPECS = {spec.name: spec for spec in (WEBGPU_SPEC, WEBGPU_BROWSER_SPEC, VULKAN_SPEC)}


#: Runtimes declared from their worker's own ``hello``, not from a table kept here: name ->
#: ``"module:function"`` returning the ``RuntimeSpec`` (the worker asked once per build), or
#: raising ``RuntimeUnavailableError`` saying why it cannot be declared (not built...).
HELLO_DECLARED = {
    "swift": "quantem_flow.runtimes.external.swift:swift_spec",
    "external-reference": "quantem_flow.runtimes.external.spec:reference_spec",
}

#: Why a runtime of :data:`HELLO_DECLARED` was named but could not be registered.
_NOT_REGISTERED: dict[str, str] = {}


def why_not_registered(name: str) -> str | None:
    """Why runtime ``name``, asked for, is not registered (``None`` if it is, or is unknown)."""
    return _NOT_REGISTERED.get(name)


def _register_from_hello(name: str) -> bool:
    from ...errors import RuntimeUnavailableError
    from ..registry import load_attribute, register_runtime

    try:
        spec = load_attribute(HELLO_DECLARED[name])()
    except RuntimeUnavailableError as exc:
        _NOT_REGISTERED[name] = str(exc)
        return False
    _NOT_REGISTERED.pop(name, None)
    register_runtime(spec)
    return True


def register_requested(names: object) -> list[str]:
    """Register the external runtimes among ``names`` (idempotent); return those registered.

    External runtimes start a process (or a browser) when probed, so they are
    not among the runtimes a worker advertises by default: they join the
    registry when asked for by name (``quantem-flow worker --runtime webgpu``,
    ``start_local_cluster(workers=[{"runtimes": ["webgpu"]}])``,
    ``QuantemFlowWorkerPlugin(runtimes=["webgpu"])``).  Those of
    :data:`HELLO_DECLARED` are declared from their built worker's ``hello``;
    one that cannot be (not built) is left out, and :func:`why_not_registered`
    says why.

    Parameters
    ----------
    names
        Runtime names (a sequence, or a comma-separated string); anything
        else registers nothing.
    """
    from ..registry import register_runtime, runtime_specs

    if isinstance(names, str):
        names = names.split(",")
    if not isinstance(names, list | tuple | set | frozenset):
        return []
    done = []
    for raw in names:
        name = raw.strip() if isinstance(raw, str) else raw
        if isinstance(name, str) and name in HELLO_DECLARED:
            if name in runtime_specs() or _register_from_hello(name):
                done.append(name)
            continue
        spec = EXTERNAL_SPECS.get(name) if isinstance(name, str) else None
        if spec is None:
            continue
        if spec.name not in runtime_specs():  # a spec registered under that name stays
            register_runtime(spec)
        done.append(spec.name)
    return done
