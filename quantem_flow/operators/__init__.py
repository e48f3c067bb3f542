"""The scientific operations: lazy, composable, one pass per dataset."""

from .base import ChunkOperator, DerivedOperator, LazyResult, Operator
from .com import center_of_mass
from .dpc import dpc, idpc
from .patterns import max_diffraction, mean_diffraction, sum_diffraction
from .probe import ProbeEstimate, estimate_probe, find_probe
from .ssb import ssb
from .virtual import (
    virtual_abf,
    virtual_adf,
    virtual_annular,
    virtual_bf,
    virtual_image,
    virtual_mask,
)

__all__ = [
    "ChunkOperator",
    "DerivedOperator",
    "LazyResult",
    "Operator",
    "ProbeEstimate",
    "center_of_mass",
    "dpc",
    "estimate_probe",
    "find_probe",
    "idpc",
    "max_diffraction",
    "mean_diffraction",
    "ssb",
    "sum_diffraction",
    "virtual_abf",
    "virtual_adf",
    "virtual_annular",
    "virtual_bf",
    "virtual_image",
    "virtual_mask",
]
