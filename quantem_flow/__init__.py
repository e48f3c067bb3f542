"""quantem-flow: a task-graph engine for 4D-STEM data.

Build lazy pipelines over chunked datasets ``I[R_r, R_c, k_r, k_c]`` and
compute them in one pass on a local or remote Dask cluster::

    import quantem_flow as qf

    ds = qf.open("scan_master.h5", scan_shape=(256, 256))
    bf, adf, com = qf.virtual_bf(ds), qf.virtual_adf(ds), qf.center_of_mass(ds)
    phase = qf.idpc(com)
    bf, adf, com, phase = qf.compute(bf, adf, com, phase)
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Any

from . import config, errors
from .calibration import Axis, Calibration
from .convert import convert
from .dataset import Dataset4D, open
from .io.results_store import load_results, results_to_json, save_results
from .operators import (
    LazyResult,
    ProbeEstimate,
    center_of_mass,
    dpc,
    estimate_probe,
    find_probe,
    idpc,
    max_diffraction,
    mean_diffraction,
    ssb,
    sum_diffraction,
    virtual_abf,
    virtual_adf,
    virtual_annular,
    virtual_bf,
    virtual_image,
    virtual_mask,
)
from .operators.display import normalize, save_png
from .pipeline import load_pipeline, run_pipeline
from .plotting import plot
from .provenance import Provenance
from .results import ComplexObject, DiffractionImage, PhaseImage, Result, ScanImage, VectorField
from .synthetic import synthetic_dataset, write_synthetic

# The graph layer (Dask, distributed, the embedded cluster) is imported on first use, not
# at ``import quantem_flow``: opening files, building pipelines and reading results need
# neither (issue 24, item 7: import time).  ``qf.compute`` and friends resolve below.
_GRAPH_NAMES = ("close_embedded_cluster", "compute", "embedded_client")


def __getattr__(name: str) -> Any:
    if name == "explore":  # Bokeh and the server load only when a user explores
        from .explorer import explore

        globals()["explore"] = explore
        return explore
    if name == "live":  # ZeroMQ and CBOR load only when a stream is received
        from .streams.session import live

        globals()["live"] = live
        return live
    if name in _GRAPH_NAMES:
        from . import graphs

        value = getattr(graphs, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'quantem_flow' has no attribute {name!r}")


def _persist(ds: Dataset4D, **kwargs: Any) -> Dataset4D:
    """``Dataset4D.persist`` before the graph layer is loaded: load it, then delegate."""
    from . import graphs  # noqa: F401 - registers the graph layer's persist

    return ds.persist(**kwargs)


from .dataset import register_persist as _register_persist  # noqa: E402

_register_persist(_persist)

if TYPE_CHECKING:  # for type checkers and IDEs: the lazy names are these
    from .explorer import explore
    from .graphs import close_embedded_cluster, compute, embedded_client
    from .streams.session import live

try:
    __version__ = importlib.metadata.version("quantem-flow")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source tree
    __version__ = "0.0.0"

__all__ = [
    "Axis",
    "Calibration",
    "ComplexObject",
    "Dataset4D",
    "DiffractionImage",
    "LazyResult",
    "PhaseImage",
    "ProbeEstimate",
    "Provenance",
    "Result",
    "ScanImage",
    "VectorField",
    "__version__",
    "center_of_mass",
    "close_embedded_cluster",
    "compute",
    "config",
    "convert",
    "dpc",
    "embedded_client",
    "errors",
    "estimate_probe",
    "explore",
    "find_probe",
    "idpc",
    "live",
    "load_pipeline",
    "load_results",
    "max_diffraction",
    "mean_diffraction",
    "normalize",
    "open",
    "plot",
    "results_to_json",
    "run_pipeline",
    "save_png",
    "save_results",
    "ssb",
    "sum_diffraction",
    "synthetic_dataset",
    "virtual_abf",
    "virtual_adf",
    "virtual_annular",
    "virtual_bf",
    "virtual_image",
    "virtual_mask",
    "write_synthetic",
]
