"""Shared check: every foundation operator gives the same result in any representation.

Used by the representation test modules; not collected itself.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

import quantem_flow as qf
from quantem_flow.dataset import Dataset4D
from quantem_flow.errors import ImplausibleParameterWarning

#: the parity check runs arbitrary geometry on small crops ON PURPOSE (parity, not
#: science): it opts out of the plausibility check, tested in tests/test_plausibility.py
_ANY = {"allow_implausible": True}


def all_operators(ds: Dataset4D, center: tuple[float, float], radius: float) -> list[Any]:
    """Every chunk operator of the foundation (and the derived ones) with explicit geometry."""
    kr, kc = ds.detector_shape
    mask = np.zeros((kr, kc), dtype=bool)
    mask[: kr // 3, kc // 4 :] = True  # asymmetric: row/col swaps change the answer
    weights = np.linspace(-1.0, 2.0, kr * kc).reshape(kr, kc)
    com = qf.center_of_mass(ds, center=center)
    return [
        qf.mean_diffraction(ds),
        qf.max_diffraction(ds),
        qf.sum_diffraction(ds),
        qf.virtual_bf(ds, radius=radius, center=center, **_ANY),
        qf.virtual_abf(ds, inner=radius / 2, outer=radius, center=center, **_ANY),
        qf.virtual_adf(ds, inner=1.5 * radius, center=center, **_ANY),
        qf.virtual_annular(ds, inner=radius / 3, outer=2 * radius, center=center, **_ANY),
        qf.virtual_mask(ds, mask),
        qf.virtual_mask(ds, weights, name="weights"),
        com,
        qf.center_of_mass(ds, center=center, mask_radius=2 * radius, **_ANY),
        qf.dpc(com, rotation_deg=30.0),
        qf.idpc(com, rotation_deg=30.0),
    ]


def assert_operator_parity(
    dense: Dataset4D,
    other: Dataset4D,
    *,
    center: tuple[float, float],
    radius: float,
    client: Any = "synchronous",
) -> list[Any]:
    """Compute every operator on both datasets and compare (integer sums exactly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImplausibleParameterWarning)
        a = qf.compute(*all_operators(dense, center, radius), client=client)
        b = qf.compute(*all_operators(other, center, radius), client=client)
    for x, y in zip(a, b, strict=True):
        assert x.data.shape == y.data.shape, (x.name, x.data.shape, y.data.shape)
        assert x.data.dtype == y.data.dtype, (x.name, x.data.dtype, y.data.dtype)
        assert x.units == y.units
        if x.data.dtype.kind in "iu":
            np.testing.assert_array_equal(x.data, y.data, err_msg=x.name)
        else:
            np.testing.assert_allclose(
                x.data, y.data, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=x.name
            )
    rep = b[0].provenance.execution["representation"]
    assert rep == other.representation
    assert b[0].provenance.dataset["representation"] == other.representation
    assert b[0].provenance.dataset["storage_schema"] == other.storage_schema
    return list(b)
