"""Which reader opens a file: content first, then the name; third-party readers by entry point."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import FormatError, ParameterError
from quantem_flow.io import (
    READERS,
    SNIFFERS,
    SUFFIXES,
    detect_format,
    open_source,
    reader_class,
    reader_names,
)
from quantem_flow.io.registry import (
    ENTRY_POINT_GROUP,
    ReaderRegistryWarning,
    clear_reader_cache,
    detect,
    reader_entry_point_errors,
    readers,
)

from . import writers

K = (6, 9)


def _frames(n: int, shape: tuple[int, int] = K, dtype: str = "uint16") -> np.ndarray:
    return np.random.default_rng().integers(1, 1000, size=(n, *shape)).astype(dtype)


def test_tables_name_the_same_readers() -> None:
    assert set(SNIFFERS) <= set(READERS)
    assert set(SUFFIXES) <= set(READERS)
    for name, suffixes in SUFFIXES.items():
        assert all(s == s.lower() for s in suffixes), name
    # Every file format with a signature is detectable by content (raw binary has none).
    for name in ("npy", "hdf5", "dectris", "zarr", "empad", "mib", "counted"):
        assert name in SNIFFERS, name
    assert "raw" not in SNIFFERS and "memory" not in SNIFFERS
    for entry in readers().values():  # every sniffer imports and says what it looks for
        if entry.sniffer is not None:
            assert entry.sniff_function() is not None
            assert not entry.looks_for().startswith("(its sniffer")


# -- every built-in format detected by content, under a name that says nothing -------------


def _renamed(path: Path, new: str) -> Path:
    return path.rename(path.parent / new)


def test_npy_by_content(tmp_path: Path) -> None:
    p = _renamed(writers.write_npy(tmp_path / "a.npy", _frames(6).reshape(2, 3, *K)), "a.dat")
    assert detect_format(p) == "npy"
    assert open_source(p).shape == (2, 3, *K)


def test_hdf5_by_content(tmp_path: Path) -> None:
    p = _renamed(writers.write_hdf5(tmp_path / "a.h5", _frames(6), dataset_path="/f"), "a.bin")
    assert detect_format(p) == "hdf5"
    assert detect(p).how.startswith("content: The HDF5 signature")


def test_hdf5_after_a_user_block_by_content(tmp_path: Path) -> None:
    import h5py

    p = tmp_path / "ub"
    with h5py.File(p, "w", userblock_size=1024) as f:
        f["d"] = _frames(4)
    assert p.read_bytes()[:8] != b"\x89HDF\r\n\x1a\n"
    assert detect_format(p) == "hdf5"


def test_zarr_by_content(tmp_path: Path) -> None:
    p = _renamed(writers.write_zarr(tmp_path / "a.zarr", _frames(6), chunks=(2, *K)), "store")
    assert detect_format(p) == "zarr"


def test_empad_by_content(tmp_path: Path) -> None:
    xml = writers.write_empad(tmp_path, "acq", np.zeros((2, 3, 128, 128), np.float32))
    p = _renamed(xml, "acq.meta")
    assert detect_format(p) == "empad"
    assert open_source(p).shape == (2, 3, 128, 128)


def test_empad_xml_with_a_long_prologue_by_content(tmp_path: Path) -> None:
    xml = writers.write_empad(tmp_path, "acq", np.zeros((1, 2, 128, 128), np.float32))
    text = xml.read_text().replace("<root", "<!-- " + "x" * 9000 + " -->\n<root", 1)
    p = tmp_path / "acq.txt"
    p.write_text(text)
    assert detect_format(p) == "empad"


def test_mib_by_content(tmp_path: Path) -> None:
    p = _renamed(writers.write_mib(tmp_path / "a.mib", _frames(2, (256, 256))), "frames.dat")
    assert detect_format(p) == "mib"


def test_counted_by_content(tmp_path: Path) -> None:
    p = writers.write_stempy(tmp_path / "ev", [np.array([0, 1])] * 6, (2, 3), K)
    assert detect_format(p) == "counted"


def test_dectris_master_by_content_and_its_data_file_as_hdf5(tmp_path: Path) -> None:
    master = _renamed(writers.write_dectris(tmp_path, "acq", _frames(4)), "acquisition")
    assert detect_format(master) == "dectris"
    assert detect_format(tmp_path / "acq_data_000001.h5") == "hdf5"


def test_content_wins_over_a_misleading_suffix(tmp_path: Path) -> None:
    p = _renamed(writers.write_npy(tmp_path / "a.npy", _frames(6)), "a.h5")
    d = detect(p)
    assert d.format == "npy" and "NUMPY" in d.how


def test_a_damaged_file_goes_to_the_reader_its_suffix_names(tmp_path: Path) -> None:
    p = tmp_path / "broken.npy"
    p.write_bytes(b"not a numpy file at all")
    d = detect(p)
    assert d.format == "npy" and d.how.startswith("suffix '.npy'")
    with pytest.raises(FormatError, match=r"not a valid \.npy file"):
        open_source(p)


def test_the_longest_suffix_wins_when_no_content_matches(tmp_path: Path) -> None:
    p = tmp_path / "x_master.h5"
    p.write_bytes(b"garbage")
    assert detect_format(p) == "dectris"


def test_an_unknown_file_lists_every_reader_and_why(tmp_path: Path) -> None:
    p = tmp_path / "mystery.dat"
    p.write_bytes(b"\x00\x01" * 100)
    with pytest.raises(FormatError) as info:
        detect_format(p)
    msg = str(info.value)
    assert "cannot tell the format" in msg and "mystery.dat" in msg
    for name in set(READERS) - {"memory"}:
        assert f"{name}: " in msg, name
    assert "npy: content not recognised (looks for: The NumPy" in msg
    assert "raw: never detected by content" in msg
    assert "pass format=" in msg


def test_an_unknown_directory_says_what_zarr_needs(tmp_path: Path) -> None:
    d = tmp_path / "folder"
    d.mkdir()
    with pytest.raises(FormatError, match=r"zarr: content not recognised \(looks for: A directory"):
        detect_format(d)


def test_qf_open_records_how_the_format_was_chosen(tmp_path: Path) -> None:
    p = _renamed(writers.write_npy(tmp_path / "a.npy", _frames(6).reshape(2, 3, *K)), "a.dat")
    ds = qf.open(p)
    assert ds.describe()["format_from"].startswith("detected by content: The NumPy")
    assert qf.open(p, format="npy").describe()["format_from"] == "given (format='npy')"
    assert qf.open(np.zeros((2, 3, 4, 5))).describe()["format_from"] == "in-memory array"


# -- third-party readers: an installed distribution with entry points ----------------------

DUMMY_MODULE = '''
"""A toy format: b"QFDUMMY1", four little-endian uint32 (R, C, k_r, k_c), uint16 frames."""

from pathlib import Path
from typing import ClassVar

import numpy as np

from quantem_flow.io.base import FrameSource, SourceIdentity, header_digest

MAGIC = b"QFDUMMY1"


class DummySource(FrameSource):
    """The toy format."""

    format: ClassVar[str] = "dummyfmt"
    suffixes: ClassVar[tuple[str, ...]] = (".qfd",)

    @staticmethod
    def sniff(path, head):
        """The magic bytes QFDUMMY1."""
        return head.startswith(MAGIC)

    def __init__(self, path, *, scan_shape=None):
        self._path = Path(path).resolve()
        head = np.fromfile(self._path, dtype="<u4", count=4, offset=8)
        R, C, kr, kc = (int(v) for v in head)
        self._set_frames(n_frames=R * C, frame_shape=(kr, kc), dtype="<u2",
                         scan_shape=scan_shape or (R, C), path=None)

    @property
    def identity(self):
        return SourceIdentity(self.format, (str(self._path),), (self._path.stat().st_size,),
                              header_digest(self.shape))

    def read_frames(self, start, stop, *, out=None):
        kr, kc = self._frame_shape
        data = np.fromfile(self._path, dtype="<u2", count=(stop - start) * kr * kc,
                           offset=24 + start * kr * kc * 2).reshape(stop - start, kr, kc)
        if out is not None:
            out[...] = data
            return out
        return data


class GuessingSource(DummySource):
    """The same toy format, declared the xarray way (guess_can_open, no sniff)."""

    format: ClassVar[str] = "guessfmt"
    suffixes: ClassVar[tuple[str, ...]] = (".qfg",)
    sniff = None

    @classmethod
    def guess_can_open(cls, path):
        """Files whose name ends with .qfg."""
        return str(path).endswith(".qfg")


class NotASource:
    format = "notasource"
'''


def write_dummy(path: Path, data: np.ndarray) -> Path:
    """Write the toy format of :data:`DUMMY_MODULE` (independently of its reader)."""
    header = b"QFDUMMY1" + np.asarray(data.shape, dtype="<u4").tobytes()
    path.write_bytes(header + np.ascontiguousarray(data, dtype="<u2").tobytes())
    return path


def _install(site: Path, dist: str, module: str | None, entry_points: str) -> None:
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    name = dist.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}\n")
    if module is not None:
        (site / f"{dist}.py").write_text(textwrap.dedent(module))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder of installed distributions on sys.path; the registry re-reads entry points."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    try:
        yield folder
    finally:
        monkeypatch.undo()
        sys.modules.pop("dummy_qf_reader", None)
        importlib.invalidate_caches()
        clear_reader_cache()


def _read_entry_points() -> None:
    importlib.invalidate_caches()
    clear_reader_cache()


def test_an_installed_distribution_registers_a_reader(site: Path, tmp_path: Path) -> None:
    _install(site, "dummy_qf_reader", DUMMY_MODULE, "dummyfmt = dummy_qf_reader:DummySource")
    _read_entry_points()
    assert "dummyfmt" in reader_names()
    entry = readers()["dummyfmt"]
    assert entry.origin == "distribution 'dummy-qf-reader 0.1'"
    assert entry.suffixes == (".qfd",)
    a = _frames(6).reshape(2, 3, *K)
    p = write_dummy(tmp_path / "scan.anything", a)
    d = detect(p)
    assert d.format == "dummyfmt" and d.how == "content: The magic bytes QFDUMMY1"
    ds = qf.open(p)
    assert ds.source.format == "dummyfmt" and ds.shape == (2, 3, *K)
    np.testing.assert_array_equal(ds.source.read((0, 2), (0, 3)), a)
    assert reader_class("dummyfmt").__name__ == "DummySource"
    # A built-in format is still detected with the plugin installed.
    assert detect_format(writers.write_npy(tmp_path / "b.npy", a)) == "npy"


def test_guess_can_open_like_xarray(site: Path, tmp_path: Path) -> None:
    _install(site, "dummy_qf_reader", DUMMY_MODULE, "guessfmt = dummy_qf_reader:GuessingSource")
    _read_entry_points()
    p = write_dummy(tmp_path / "scan.qfg", _frames(6).reshape(2, 3, *K))
    d = detect(p)
    assert d.format == "guessfmt" and "Files whose name ends with .qfg" in d.how


def test_two_readers_recognising_one_file_are_listed(site: Path, tmp_path: Path) -> None:
    module = DUMMY_MODULE + (
        "\n\nclass TwinSource(DummySource):\n"
        '    """A second reader of the same bytes."""\n\n'
        '    format: ClassVar[str] = "twinfmt"\n'
        '    suffixes: ClassVar[tuple[str, ...]] = (".twin",)\n'
    )
    _install(
        site,
        "dummy_qf_reader",
        module,
        "dummyfmt = dummy_qf_reader:DummySource\ntwinfmt = dummy_qf_reader:TwinSource",
    )
    _read_entry_points()
    a = _frames(6).reshape(2, 3, *K)
    p = write_dummy(tmp_path / "scan.dat", a)
    with pytest.raises(FormatError) as info:
        detect_format(p)
    msg = str(info.value)
    assert "recognised by several readers" in msg
    assert "dummyfmt: content recognised (The magic bytes QFDUMMY1)" in msg
    assert "twinfmt: content recognised" in msg
    assert "Pass format= one of ['dummyfmt', 'twinfmt']" in msg
    # The name's suffix chooses between them, and says so.
    twin = write_dummy(tmp_path / "scan.twin", a)
    d = detect(twin)
    assert d.format == "twinfmt" and "suffix '.twin' chose 'twinfmt'" in d.how
    assert open_source(p, format="dummyfmt").shape == a.shape


def test_a_broken_entry_point_is_reported_and_the_builtins_still_work(
    site: Path, tmp_path: Path
) -> None:
    _install(
        site,
        "dummy_qf_reader",
        DUMMY_MODULE,
        "dummyfmt = dummy_qf_reader:DummySource\n"
        "missing = dummy_qf_reader:DoesNotExist\n"
        "notasource = dummy_qf_reader:NotASource\n"
        "npy = dummy_qf_reader:DummySource\n"
        "wrongname = dummy_qf_reader:DummySource\n",
    )
    _read_entry_points()
    with pytest.warns(ReaderRegistryWarning) as caught:
        names = reader_names()
    messages = " | ".join(str(w.message) for w in caught)
    assert "dummy-qf-reader" in messages
    errors = reader_entry_point_errors()
    assert set(errors) == {"missing", "notasource", "npy", "wrongname"}
    assert "AttributeError" in errors["missing"]
    assert "not a quantem_flow.io.Source subclass" in errors["notasource"]
    assert "a built-in reader it may not replace" in errors["npy"]
    assert "format='dummyfmt', not the entry point's name 'wrongname'" in errors["wrongname"]
    assert "dummyfmt" in names and "missing" not in names
    assert readers()["npy"].origin == "built-in"
    with pytest.raises(ParameterError, match="an installed reader of that name failed"):
        reader_class("missing")
    # Built-in readers keep working.
    a = _frames(6).reshape(2, 3, *K)
    assert open_source(writers.write_npy(tmp_path / "a.npy", a)).format == "npy"


def test_a_sniffer_that_raises_does_not_break_detection(site: Path, tmp_path: Path) -> None:
    module = DUMMY_MODULE + (
        "\n\nclass RaisingSource(DummySource):\n"
        '    format: ClassVar[str] = "raisingfmt"\n\n'
        "    @staticmethod\n"
        "    def sniff(path, head):\n"
        '        """Anything: it raises."""\n'
        '        raise RuntimeError("sniffer bug")\n'
    )
    _install(site, "dummy_qf_reader", module, "raisingfmt = dummy_qf_reader:RaisingSource")
    _read_entry_points()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raising sniffer is not a registration failure
        a = _frames(6).reshape(2, 3, *K)
        assert detect_format(writers.write_npy(tmp_path / "a.npy", a)) == "npy"
    p = tmp_path / "x.unknown"
    p.write_bytes(b"nothing")
    with pytest.raises(FormatError, match="its sniffer raised RuntimeError: sniffer bug"):
        detect_format(p)
