"""EMD 1.0 (py4DSTEM / emdfile) datacubes: exact reads, dims calibration, detection, errors."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest

from quantem_flow.errors import DatasetPathError, FormatError
from quantem_flow.io import detect_format, open_source
from quantem_flow.io.emd import EmdSource, sniff

from . import writers
from .conformance_cases_emd import CASES
from .writers_emd import write_emd


def _data(shape: tuple[int, ...] = (4, 3, 5, 8)) -> np.ndarray:
    return np.arange(int(np.prod(shape))).reshape(shape).astype("uint16")


@pytest.mark.parametrize("name", sorted(CASES))
def test_conformance_cases_read_exactly(name: str, tmp_path: Path) -> None:
    case = CASES[name](tmp_path, np.random.default_rng())
    src = open_source(case.target, **case.options)
    assert src.format == "emd" and src.shape == case.expected.shape
    np.testing.assert_array_equal(src.read((0, 5), (0, 7)), case.expected)
    np.testing.assert_array_equal(src.read((1, 4), (2, 5)), case.expected[1:4, 2:5])
    again = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(again.read((4, 5), (0, 7)), case.expected[4:5])


def test_calibration_from_dimension_vectors(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "c.emd", _data(), r_step=0.8, q_step=0.05, q_first=(-0.1, -0.3))
    src = EmdSource(p)
    cal = src.calibration
    assert cal is not None
    assert cal.scan_units == "Å" and cal.scan_sampling == pytest.approx((0.8, 1.2))
    assert cal.detector_units == "1/Å" and cal.detector_sampling == pytest.approx((0.05, 0.1))
    assert cal.detector_origin == pytest.approx((2.0, 3.0))
    md = src.metadata
    assert md["emd_group"] == "/experiment/datacube"
    assert "EMD dimension vectors" in md["calibration_from"]
    assert [d["name"] for d in md["dims"]] == ["Rx", "Ry", "Qx", "Qy"]
    json.dumps(md)


@pytest.mark.parametrize("full", [False, True])
def test_emd_02_one_based_full_dims(full: bool, tmp_path: Path) -> None:
    p = write_emd(
        tmp_path / "o.emd", _data(), one_based=True, full_dims=full, r_units="nm", q_units="mrad"
    )
    cal = EmdSource(p).calibration
    assert cal is not None and cal.scan_units == "nm" and cal.detector_units == "mrad"


def test_reciprocal_nm_converted_and_pixels_uncalibrated(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "n.emd", _data(), r_units="pixels", q_units="1/nm", q_step=0.5)
    cal = EmdSource(p).calibration
    assert cal is not None
    assert cal.scan_units == "px" and cal.detector_sampling == pytest.approx((0.05, 0.1))


def test_unknown_units_leave_axes_uncalibrated_with_a_note(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "u.emd", _data(), r_units="parsec", q_units="pixels")
    src = EmdSource(p)
    assert src.calibration is None
    assert any("parsec" in n for n in src.notes)


def test_string_group_type_and_several_arrays(tmp_path: Path) -> None:
    p = write_emd(
        tmp_path / "s.emd",
        _data(),
        group_type="array",
        extra_arrays={"virtual_bf": np.zeros((4, 3)), "other_cube": np.zeros((2, 2, 2, 2))},
    )
    with pytest.raises(DatasetPathError) as info:
        EmdSource(p)
    assert "2 EMD arrays with 4-D data" in str(info.value)
    assert "/experiment/other_cube" in str(info.value)
    src = EmdSource(p, dataset_path="/experiment/datacube")
    np.testing.assert_array_equal(src.read((0, 4), (0, 3)), _data())
    src = EmdSource(p, dataset_path="/experiment/datacube/data")
    assert src.metadata["emd_group"] == "/experiment/datacube"


def test_not_an_array_group_raises(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "g.emd", _data())
    with pytest.raises(DatasetPathError) as info:
        EmdSource(p, dataset_path="/experiment")
    assert "'/experiment' in" in str(info.value) and "/experiment/datacube" in str(info.value)


def test_lying_dimension_vector_raises(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "l.emd", _data())
    with h5py.File(p, "a") as f:
        del f["experiment/datacube/dim2"]
        f["experiment/datacube/dim2"] = np.arange(7.0)  # the axis has 5 pixels
    with pytest.raises(FormatError) as info:
        EmdSource(p)
    assert str(p) in str(info.value) and "'dim2' holds 7 values" in str(info.value)


def test_three_d_data_is_refused(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "t.emd", _data())
    with h5py.File(p, "a") as f:
        del f["experiment/datacube/data"]
        f["experiment/datacube/data"] = np.zeros((12, 5, 8))
    with pytest.raises(FormatError) as info:
        EmdSource(p, dataset_path="/experiment/datacube")
    assert "(12, 5, 8)" in str(info.value) and "4-D" in str(info.value)


def test_truncated_file_is_a_format_error(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "x.emd", _data((6, 5, 32, 32)))
    p.write_bytes(p.read_bytes()[:3000])
    with pytest.raises(FormatError) as info:
        open_source(p, format="emd")
    assert str(p) in str(info.value)


def test_detection_tells_emd_from_plain_hdf5(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "datacube.h5", _data())
    assert sniff(p, p.read_bytes()[:4096])
    assert detect_format(p) == "emd"
    plain = writers.write_hdf5(tmp_path / "plain.emd", _data())
    assert not sniff(plain, plain.read_bytes()[:4096])
    assert detect_format(plain) == "hdf5"


def test_non_finite_first_value_gives_no_optical_axis(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "f.emd", _data())
    with h5py.File(p, "a") as f:
        f["experiment/datacube/dim2"][0] = np.nan  # a damaged vector: its step is NaN too
        f["experiment/datacube/dim3"][0] = np.inf
    src = EmdSource(p)
    cal = src.calibration
    assert cal is not None and cal.scan_units == "Å" and cal.detector_units == "px"
    assert cal.detector_origin is None
    assert any("positive steps" in n for n in src.notes)


def test_sampling_that_underflows_on_conversion_is_dropped_with_a_note(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "s.emd", _data(), q_units="1/nm", q_step=5e-324)  # 0 after x 0.1
    src = EmdSource(p)
    cal = src.calibration
    assert cal is not None and cal.scan_units == "Å" and cal.detector_units == "px"
    assert any("not finite and positive" in n for n in src.notes)


_READ_IN_A_CHILD = """
import sys
import quantem_flow as qf
ds = qf.open(sys.argv[1], format=sys.argv[2])
for rows in ds.chunks:
    ds.load_block(rows)
print(ds.source.metadata[sys.argv[3]])
"""


def _corrupt_vlen_kind(path: Path, name: bytes) -> None:
    """Make the first attribute ``name`` (a variable-length string) a sequence of kind 5.

    The datatype message follows the attribute's name (padded to 8 bytes):
    class 9 (variable length), version 1, then the kind in the low nibble of
    the first class bit field (0: sequence, 1: string; 5 is undefined).
    """
    raw = bytearray(path.read_bytes())
    pad = -len(name) % 8 or 8
    at = raw.index(name + b"\x00" * pad + b"\x19\x01") + len(name) + pad + 1
    raw[at] = 0x05
    path.write_bytes(bytes(raw))


def test_an_attribute_of_a_damaged_variable_length_kind_is_not_read(tmp_path: Path) -> None:
    # found by tests/fuzz_readers.py: HDF5 crashed the process (SIGSEGV) reading it
    import subprocess
    import sys

    p = write_emd(tmp_path / "v.emd", _data())
    _corrupt_vlen_kind(p, b"emd_group_type")  # the file's: written first
    child = subprocess.run(
        [sys.executable, "-c", _READ_IN_A_CHILD, str(p), "emd", "emd_file_attributes"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert "'emd_group_type': '<not read: a variable-length sequence>'" in child.stdout
    assert "'version_major': 1" in child.stdout


def test_a_dimension_vector_that_is_not_numeric_is_a_format_error(tmp_path: Path) -> None:
    p = write_emd(tmp_path / "s.emd", _data())
    with h5py.File(p, "a") as f:
        del f["experiment/datacube/dim1"]
        f["experiment/datacube/dim1"] = np.array([b"a", b"b"])
    with pytest.raises(FormatError, match=r"'dim1' is \|S1; expected a numeric dataset"):
        EmdSource(p)


def test_prismatic_datacube_is_read_with_its_dimension_vectors(tmp_path: Path) -> None:
    import quantem_flow as qf

    from .writers_emd import write_emd

    rng = np.random.default_rng(8)
    a = rng.random((3, 4, 10, 12)).astype("float32")
    p = write_emd(
        tmp_path / "prismatic.h5",
        a,
        group="4DSTEM_simulation/data/datacubes/CBED_array_depth0000",
        array_name="datacube",
        one_based=True,
        full_dims=True,
        r_units="[Å]",
        q_units="[mrad]",
        q_step=1.5,
        q_first=(-7.5, -9.0),
    )
    ds = qf.open(p)
    assert ds.source.format == "emd"
    np.testing.assert_array_equal(ds.load_block((0, 3)), a)
    cal = ds.calibration
    assert cal.scan_units == "Å" and cal.scan_sampling == pytest.approx((0.8, 1.2))
    assert cal.detector_units == "mrad" and cal.detector_sampling == pytest.approx((1.5, 3.0))
    assert cal.detector_origin == pytest.approx((5.0, 3.0))  # where the angles are zero
    assert any("'datacube'" in n and "Prismatic" in n for n in ds.source.notes)
