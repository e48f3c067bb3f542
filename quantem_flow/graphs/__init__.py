"""Lowering to Dask, annotations, execution and the embedded cluster."""

from typing import TYPE_CHECKING, Any

from . import persist as _persist  # noqa: F401 - registers Dataset4D.persist
from .annotations import ANNOTATION_KEYS, validate_annotations
from .execute import compute
from .lowering import LoweredPass, lower_pass

# the embedded cluster's module imports distributed (0.15-0.3 s): loaded when first asked for,
# so a synchronous compute (client="synchronous") never imports it
_CLUSTER_NAMES = (
    "close_embedded_cluster",
    "dashboard_url",
    "embedded_client",
    "start_local_cluster",
)


def __getattr__(name: str) -> Any:
    if name in _CLUSTER_NAMES:
        from . import cluster

        value = getattr(cluster, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'quantem_flow.graphs' has no attribute {name!r}")


if TYPE_CHECKING:
    from .cluster import close_embedded_cluster, dashboard_url, embedded_client, start_local_cluster

__all__ = [
    "ANNOTATION_KEYS",
    "LoweredPass",
    "close_embedded_cluster",
    "compute",
    "dashboard_url",
    "embedded_client",
    "lower_pass",
    "start_local_cluster",
    "validate_annotations",
]
