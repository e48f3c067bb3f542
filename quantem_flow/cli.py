"""The ``quantem-flow`` command line: ``info``, ``run``, ``demo``, ``convert``, ``worker``...

Errors of quantem-flow (bad parameters, missing files, unknown formats...)
print one line to stderr and exit with status 2; anything else is a bug and
shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ParameterError, QuantemFlowError

__all__ = ["DEMO_SIZES", "cli_terms", "main"]

#: Parameters of :func:`quantem_flow.synthetic.synthetic_dataset` for ``demo --size``.
DEMO_SIZES: dict[str, dict[str, Any]] = {
    # the wave-optics model: a weak phase object under a 20 mrad, 300 kV probe,
    # calibrated (scan in Å, detector in mrad), consistent for SSB as for DPC
    "small": {
        "model": "wave",
        "scan_shape": (48, 64),
        "detector_shape": (64, 72),
        "dose_per_frame": 5e4,
        "seed": 0,
        "dtype": "uint16",
    },
    "medium": {
        "model": "wave",
        "scan_shape": (128, 128),
        "detector_shape": (96, 96),
        "dose_per_frame": 5e4,
        "seed": 0,
        "dtype": "uint16",
    },
}
DEMO_DATA_NAME = "synthetic_4dstem.h5"
DEMO_PIPELINE_NAME = "demo.yaml"
EXIT_USER_ERROR = 2


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _size(nbytes: float) -> str:
    """Bytes in MiB, or KiB below 1 MiB (so small files do not read 0.0 MiB)."""
    return _mib(nbytes) if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


# -- flags ----------------------------------------------------------------------------------
_FLAGS = {"scan_shape": "--scan-shape", "dataset_path": "--dataset-path", "format": "--format"}


def cli_terms(message: str) -> str:
    """Rewrite Python advice in an error message as this command's flags.

    ``scan_shape=(rows, cols)`` becomes ``--scan-shape ROWS COLS``,
    ``scan_shape='square'`` ``--scan-shape square``, ``dataset_path=`` and
    ``format=`` ``--dataset-path``/``--format``, ``overwrite=True``
    ``--overwrite``, ``to='counted'`` ``--to counted``.

    Parameters
    ----------
    message
        The error message as raised by the library.

    Returns
    -------
    str
        The message in command-line terms.
    """

    def flag(match: re.Match[str]) -> str:
        name, value = match.group(1), (match.group(2) or "").strip()
        option = _FLAGS.get(name, "--to")
        if value.startswith("(") and value.endswith(")"):
            parts = [v.strip() for v in value[1:-1].split(",")]
            value = " ".join(p.upper() if p.isidentifier() else p for p in parts)
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        return f"{option} {value}" if value and value != "..." else option

    text = re.sub(r"(?<![\w.\-])overwrite=True\b", "--overwrite", message)
    return re.sub(
        r"(?<![\w.\-])(scan_shape|dataset_path|format|to)="
        r"(\([^()]*\)|'[^']*'|\"[^\"]*\"|\.\.\.|[A-Za-z0-9_/]+)?",
        flag,
        text,
    )


def _scan_shape_option(values: Sequence[str]) -> tuple[int, int] | str:
    """``--scan-shape R C`` or ``--scan-shape square``."""
    if list(values) == ["square"]:
        return "square"
    if len(values) == 2 and all(v.isdigit() for v in values):
        return (int(values[0]), int(values[1]))
    raise ParameterError(
        f"--scan-shape takes two integers ROWS COLS, or 'square' to assume a square scan "
        f"(recorded), got {' '.join(values)!r}"
    )


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """``--format``, ``--scan-shape`` and ``--dataset-path``: how a command opens its input."""
    p.add_argument("--format", help="reader name (default: guessed from the name)")
    p.add_argument(
        "--scan-shape",
        nargs="+",
        metavar="R C",
        help="scan rows and columns, for files of flat frames (or 'square', recorded)",
    )
    p.add_argument("--dataset-path", help="dataset inside an HDF5 file, e.g. /data")


def _input_options(args: argparse.Namespace) -> dict[str, Any]:
    """The reader options ``--scan-shape`` and ``--dataset-path`` give (those given)."""
    options: dict[str, Any] = {}
    if args.scan_shape is not None:
        options["scan_shape"] = _scan_shape_option(args.scan_shape)
    if args.dataset_path is not None:
        options["dataset_path"] = args.dataset_path
    return options


# -- info -----------------------------------------------------------------------------------
def _calibration_lines(cal: Mapping[str, Any]) -> list[str]:
    def axis(kind: str) -> str:
        s = cal[f"{kind}_sampling"]
        u = cal[f"{kind}_units"]
        text = f"{s[0]:g} x {s[1]:g} {u} per pixel (row, col)"
        if u == "px":
            text += " -- uncalibrated"
        return text

    origin = cal.get("detector_origin")
    kv = cal.get("accelerating_voltage_kV")
    signs = list(cal.get("scan_step_signs") or [1, 1])
    direction = (
        ""
        if signs == [1, 1]
        else f"; steps {'+' if signs[0] > 0 else '-'}row {'+' if signs[1] > 0 else '-'}col "
        "(positions decrease where -)"
    )
    return [
        f"  scan:      {axis('scan')}{direction}",
        f"  detector:  {axis('detector')}",
        "  origin:    " + ("unknown" if origin is None else f"({origin[0]:g}, {origin[1]:g}) px"),
        "  voltage:   " + ("unknown" if kv is None else f"{kv:g} kV"),
    ]


def _hdf5_default_path(path: Path) -> tuple[str, str]:
    """Return the only 3-D/4-D dataset of an HDF5 file, or raise listing the candidates."""
    from .io.hdf5 import candidate_datasets, describe_datasets, open_h5

    with open_h5(path) as f:
        found = candidate_datasets(f)
    if len(found) == 1:
        return found[0][0], (
            f"dataset_path {found[0][0]} chosen: the only 3-D/4-D dataset in the file"
        )
    raise ParameterError(
        f"{str(path)!r} is an HDF5 file; pass --dataset-path, one of the 3-D/4-D datasets "
        f"(path, shape, dtype): {describe_datasets(found)}"
    )


def _live(args: argparse.Namespace) -> int:
    """Run a pipeline on one series from a stream, updating its results as rows arrive."""
    from .pipeline import load_pipeline, prepare_pipeline, save_pipeline_results
    from .streams.session import live

    match = re.fullmatch(r"(\d+)x(\d+)", str(args.scan))
    if match is None:
        raise ParameterError(f"--scan takes ROWSxCOLS such as 256x256, got {args.scan!r}")
    scan = (int(match.group(1)), int(match.group(2)))
    protocol, endpoint = ("dectris", args.dectris) if args.dectris else ("merlin", args.merlin)
    pipe = load_pipeline(Path(args.pipeline))
    acq = live(
        endpoint,
        scan_shape=scan,
        protocol=protocol,
        directory=args.keep,
        timeout_s=args.timeout,
        start_timeout_s=args.start_timeout,
        calibration=pipe.input.calibration,
        chunk_rows=pipe.input.chunk_rows,
        keep_hdf5=args.keep_hdf5,
    )
    _say(f"live:      receiving a {scan[0]} x {scan[1]} scan from {endpoint} ({protocol})")
    sys.stdout.flush()
    client, where = _start_client(args.scheduler)
    try:
        acq.wait_started()
        # the pipeline's checks (outputs, units, files) against the stream's frames, before
        # anything is computed
        prepared = prepare_pipeline(
            pipe,
            output_dir=args.output_dir,
            overwrite=True if args.overwrite else None,
            dataset=acq.dataset_view(),
        )
        _say(
            f"scheduler: {where}",
            f"computing {', '.join(pipe.outputs)} as scan rows arrive ...",
        )
        if client is not None and not isinstance(client, str):
            from .graphs.cluster import flow_dashboard_url

            page = flow_dashboard_url(client)
            if page:
                _say(f"page:      {page} (the images fill in as the scan runs)")
        sys.stdout.flush()
        updates = acq.watch(
            lambda view: list(pipe.build(pipe.apply_transforms(view)).values()),
            client=None if args.scheduler is None else client,
            allow_incomplete=bool(args.allow_incomplete),
        )
        shown = 0  # the first line when rows have results
        while not updates.final:
            if updates.error is not None:
                break
            if updates.rows != shown:
                shown = updates.rows
                _say(f"live:      results over {shown} of {scan[0]} scan rows")
                sys.stdout.flush()
            updates.wait_rows(shown + 1, timeout_s=args.timeout + 60)
        report = acq.wait(timeout_s=60)
        _say(f"live:      series {report.describe()}")
        computed = updates.wait(timeout_s=600)
        results = save_pipeline_results(prepared, computed)
    finally:
        _finish_client(client, args.scheduler)
        if args.keep is None:
            acq.close()
    _report_results(results)
    _report_files(pipe.save_targets(args.output_dir))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    """Serve one series of a dataset's frames as a DECTRIS stream v2, then exit."""
    from . import open as open_dataset
    from .streams.dectris_sim import DectrisSimulator

    ds = open_dataset(args.file, format=args.format, **_input_options(args))
    R, C = ds.scan_shape

    def rows(a: int, b: int) -> Any:  # frames [a, b) in scan order, read row block by row block
        import numpy as np

        r0, r1 = a // C, (b - 1) // C + 1
        block = np.asarray(ds.load_block((r0, r1))).reshape(-1, *ds.detector_shape)
        return block[a - r0 * C : b - r0 * C]

    if args.kind == "merlin":
        from .streams.merlin_tcp import MerlinSimulator

        host, _, port = str(args.bind).removeprefix("tcp://").rpartition(":")
        if not host or not port.isdigit():
            raise ParameterError(f"--bind takes tcp://HOST:PORT, got {args.bind!r}")
        merlin = MerlinSimulator(
            rows,
            host=host,
            port=int(port),
            rate_hz=args.rate,
            n_frames=R * C,
            frame_shape=ds.detector_shape,
            dtype=ds.dtype,
        )
        _say(
            f"simulate:  Merlin TCP data socket at tcp://{merlin.host}:{merlin.port}: {R} x {C} "
            f"scan of {ds.detector_shape[0]} x {ds.detector_shape[1]} {ds.dtype} frames"
        )
        sys.stdout.flush()
        try:
            merlin.start()
            merlin.join(timeout_s=1e7)
        finally:
            merlin.close()
        _say(f"simulate:  sent {merlin.sent} frames")
        return 0
    sim = DectrisSimulator(
        rows,
        endpoint=args.bind,
        rate_hz=args.rate,
        compression=None if args.compression == "none" else args.compression,
        n_frames=R * C,
        frame_shape=ds.detector_shape,
    )
    sim.send_timeout_s = float(args.timeout)
    _say(
        f"simulate:  DECTRIS stream v2 at {sim.endpoint}: {R} x {C} scan of "
        f"{ds.detector_shape[0]} x {ds.detector_shape[1]} {ds.dtype} frames, "
        f"{args.compression}, {'as fast as taken' if args.rate is None else f'{args.rate:g} Hz'}",
    )
    sys.stdout.flush()
    try:
        sim.start()
        sim.join(timeout_s=1e7)  # the run ends itself: end message sent, or no consumer
    finally:
        sim.close()
    _say(f"simulate:  sent {sim.sent} images and the end message")
    return 0


def _info_results(path: Path, *, as_json: bool) -> int:
    """``info`` on a results file: its results, not a 4D-STEM input."""
    from .io.results_store import describe_results

    doc = describe_results(path)
    if as_json:
        print(json.dumps(doc, indent=2, ensure_ascii=False, default=str))
        return 0
    _say(f"file:      {doc['path']}")
    _say(
        f"kind:      quantem-flow results ({doc['format']}, layout {doc['layout_version']}, "
        f"written by {doc['written_by']}); not a 4D-STEM input"
    )
    _say(f"results:   {len(doc['results'])}")
    for r in doc["results"]:
        shape = " x ".join(str(n) for n in r["shape"])
        _say(
            f"  {r['name']:<14} {r['kind']:<17} {shape:<12} {r['dtype']:<8} {r['units']:<18} "
            f"axes {', '.join(r['axes'])}"
        )
    sources = {
        (str(r["source"].get("paths")), str(r["source"].get("header_sha256")))
        for r in doc["results"]
    }
    for paths, digest in sorted(sources):
        _say(f"source:    {paths} (header SHA-256 {digest[:16]}...)")
    _say(f"load with: {doc['load_with']}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from . import open as open_dataset
    from .io import detect_format
    from .io.results_store import is_results_store

    if args.format is None and is_results_store(Path(args.file).expanduser()):
        return _info_results(Path(args.file).expanduser(), as_json=bool(args.json))
    options = _input_options(args)
    notes: list[str] = []
    fmt = args.format or detect_format(args.file)
    if args.dataset_path is None and fmt == "hdf5":
        options["dataset_path"], note = _hdf5_default_path(Path(args.file).expanduser())
        notes.append(note)
    ds = open_dataset(args.file, format=fmt, **options)
    src = ds.source
    desc = ds.describe()
    chunk_bytes = ds.chunk_rows * ds.read_nbytes / max(ds.shape[0], 1)
    doc = {
        "path": str(getattr(src, "path", args.file)),
        "format": src.format,
        "shape": list(ds.shape),
        "axes": ["R_r", "R_c", "k_r", "k_c"],
        "dtype": str(ds.dtype),
        "nbytes": ds.nbytes,
        "chunks": {
            "n_chunks": desc["n_chunks"],
            "scan_rows_per_chunk": desc["chunk_rows"],
            "bytes_per_chunk": int(chunk_bytes),
        },
        "calibration": desc["calibration"],
        "identity": src.identity.to_dict(),
        "metadata": src.metadata,
        "notes": [*notes, *ds.notes],
    }
    if args.json:
        print(json.dumps(doc, indent=2, ensure_ascii=False, default=str))
        return 0
    R, C, kr, kc = ds.shape
    _say(
        f"file:      {doc['path']}",
        f"format:    {src.format}",
        f"shape:     ({R}, {C}, {kr}, {kc})  (R_r, R_c, k_r, k_c): scan {R} x {C}, "
        f"detector {kr} x {kc}",
        f"dtype:     {ds.dtype}",
        f"size:      {_mib(ds.nbytes)} (decoded)",
        f"chunks:    {desc['n_chunks']} of {desc['chunk_rows']} scan rows "
        f"(~{_mib(chunk_bytes)} each)",
        "calibration:",
        *_calibration_lines(desc["calibration"]),
        "identity:",
        *(f"  {k}: {v}" for k, v in doc["identity"].items()),
        "metadata:",
        *(
            f"  {key}: {json.dumps(value, ensure_ascii=False, default=str)}"
            for key, value in src.metadata.items()
        ),
    )
    if doc["notes"]:
        _say("notes:", *(f"  - {n}" for n in doc["notes"]))
    return 0


# -- explore -------------------------------------------------------------------------------
def _explore(args: argparse.Namespace) -> int:
    import signal
    import threading

    from . import open as open_dataset
    from .explorer import InputSpec, explore
    from .io import detect_format

    options = _input_options(args)
    fmt = args.format or detect_format(args.file)
    if args.dataset_path is None and fmt == "hdf5":
        options["dataset_path"], note = _hdf5_default_path(Path(args.file).expanduser())
        _say(f"note: {note}")
    ds = open_dataset(args.file, format=fmt, **options)
    client, where = _start_client(args.scheduler)
    _say(f"persisting {ds.nbytes / 2**30:.2f} GiB on the {where}...")
    spec_options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    explorer = explore(
        ds,
        client=client,
        host=args.host,
        port=args.port,
        input_spec=InputSpec(path=str(args.file), format=fmt, options=spec_options),
        export_dir=args.export_dir,
    )
    _say(
        f"quantem-flow explore: {explorer.url}",
        "open it in a browser (the token is the key; share it only with people you trust);",
        "Ctrl-C stops the explorer.",
    )
    if args.host not in ("127.0.0.1", "localhost"):
        _say(f"warning: serving on {args.host}: anyone who can reach it and has the URL can use it")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait(args.timeout if args.timeout else None)
    except KeyboardInterrupt:
        pass
    finally:
        explorer.close()
        _say("explorer stopped; resident chunks released")
    return 0


# -- run and demo -------------------------------------------------------------------------
def _start_client(scheduler: str | None) -> tuple[Any, str]:
    """Return ``(client, description)`` for ``--scheduler``."""
    if scheduler == "synchronous":
        return "synchronous", "synchronous (this process, no workers)"
    if scheduler == "threads":
        from .graphs.runner import in_process_threads

        return "threads", f"threads (this process on {in_process_threads()} threads, no workers)"
    if scheduler is None:
        from .graphs import embedded_client

        client = embedded_client()
        where = "embedded local cluster"
    else:
        if "://" not in scheduler:
            raise ParameterError(
                "a scheduler address such as tcp://127.0.0.1:8786, 'threads' or 'synchronous' "
                f"is needed, got {scheduler!r}"
            )
        from distributed import Client

        try:
            client = Client(scheduler, set_as_default=False, timeout=10)
        except OSError as exc:
            raise ParameterError(
                f"could not connect to the scheduler at {scheduler}: {exc}; check the address "
                "and that the scheduler runs"
            ) from exc
        where = "scheduler"
    n = len(client.scheduler_info().get("workers", {}))
    return client, f"{where} at {client.scheduler.address} ({n} worker(s))"


def _report_dashboard(client: Any) -> None:
    """Print the cluster's dashboard: the quantem-flow page, and Dask's own."""
    if isinstance(client, str):
        return
    from .graphs.cluster import dashboard_url, flow_dashboard_url

    url = flow_dashboard_url(client)
    if url is None:
        _say("dashboard: none (install bokeh for the Dask dashboard)")
    else:
        _say(
            f"dashboard: {url}  (placement and residency; Dask's own: {dashboard_url(client)}; "
            "live while this command runs)"
        )


def _finish_client(client: Any, scheduler: str | None) -> None:
    if isinstance(client, str):
        return
    if scheduler is None:
        from .graphs import close_embedded_cluster

        close_embedded_cluster()
    else:
        client.close()


def _report_results(results: Mapping[str, Any]) -> None:
    _say("results:")
    for name, r in results.items():
        shape = " x ".join(str(s) for s in r.shape)
        _say(f"  {name:<14} {type(r).kind:<17} {shape:<14} {r.units}")


def _report_files(targets: Any, extra: Sequence[tuple[str, Path]] = ()) -> None:
    _say("files:")
    for label, path in extra:
        _say(f"  {label:<11} {path}")
    if targets.results is not None:
        _say(f"  {'results':<11} {targets.results}")
    if targets.json is not None:
        _say(f"  {'provenance':<11} {targets.json}")
    for i, png in enumerate(targets.png_files.values()):
        _say(f"  {'images' if i == 0 else '':<11} {png}")


def _figures_dir(targets: Any, given: str | None) -> Path | None:
    """Where ``run``/``demo`` write figures: ``given``, else ``figures/`` beside the outputs."""
    if given is not None:
        return Path(given).expanduser().absolute()
    if targets.png_dir is not None:
        return Path(targets.png_dir).parent / "figures"
    for path in (targets.results, targets.json):
        if path is not None:
            return Path(path).parent / "figures"
    return None


def _check_figures(
    names: Sequence[str],
    folder: Path | None,
    overwrite: bool,
    *,
    remedy: str = "pass --overwrite, --figures DIR, or --no-figures",
) -> None:
    """Refuse, before anything is computed, to replace figures without --overwrite.

    ``remedy`` names only options of the command that calls it (a test keeps
    every option named in a message real).
    """
    if folder is None:
        return
    from .io.results_store import check_replaceable
    from .plotting import figure_paths

    existing = [p for p in figure_paths(names, folder).values() if p.exists() or p.is_symlink()]
    if overwrite:
        for p in existing:
            check_replaceable(p)  # only figures quantem-flow wrote
        return
    if existing:
        raise ParameterError(
            f"figure file(s) already exist: {[str(p) for p in existing[:4]]}; {remedy}"
        )


def _write_figures(results: Mapping[str, Any], folder: Path | None) -> None:
    if folder is None:
        return
    from .plotting import write_figures

    paths = write_figures(results, folder, overwrite=True)
    _say(f"figures:   {folder} ({len(paths)} PNG: {', '.join(p.name for p in paths.values())})")


def _example_pipeline_file(args: argparse.Namespace) -> tuple[Path, str | None]:
    """Copy a shipped example into ``--output-dir`` and write its synthetic data if missing.

    Returns the pipeline file to run and the ``--output-dir`` to pass on
    (``None``: the save paths are relative to the copied file's folder).
    """
    from .pipeline import example_pipeline, load_pipeline, strict_yaml_load
    from .synthetic import write_synthetic

    name = args.example
    template = example_pipeline(name).read_text(encoding="utf-8")
    out = Path(args.output_dir or f"quantem-flow-{name}").expanduser().absolute()
    yaml_path = out / f"{name}.yaml"
    planned = load_pipeline(strict_yaml_load(template, f"example {name}"), base_dir=out)
    replace = bool(args.overwrite or (planned.save is not None and planned.save.overwrite))
    if yaml_path.exists() and yaml_path.read_text(encoding="utf-8") != template and not replace:
        raise ParameterError(
            f"{str(yaml_path)!r} exists and differs from the shipped example {name!r}; pass "
            "--overwrite to replace it, choose another --output-dir, or run your edited copy "
            f"with `quantem-flow run {yaml_path}`"
        )
    existing = planned.save_targets().existing()
    if existing and not replace:  # before any data is written
        raise ParameterError(
            f"output file(s) of example {name!r} already exist: "
            f"{[str(p) for p in existing[:4]]}; pass --overwrite or choose another --output-dir"
        )
    data = planned.input.path
    if not data.exists():
        params = DEMO_SIZES["small"]
        R, C = params["scan_shape"]
        kr, kc = params["detector_shape"]
        _say(
            f"example:   {name}: writing its synthetic input (scan {R} x {C}, detector "
            f"{kr} x {kc}, {params['dtype']}) to {data}"
        )
        write_synthetic(data, format="hdf5", **params)
    else:
        _say(f"example:   {name}: its input {data} exists; using it")
    out.mkdir(parents=True, exist_ok=True)
    yaml_path.write_text(template, encoding="utf-8")
    return yaml_path, None


def _refuse_shipped_example(path: Path) -> None:
    """Refuse to run a shipped example in place (its data and outputs would land there)."""
    from .pipeline import example_pipeline

    folder = example_pipeline("demo").parent.resolve()
    if path.expanduser().resolve().parent == folder:
        name = path.name.removesuffix(".yaml")
        raise ParameterError(
            f"{str(path)!r} is an example shipped inside the package; it is not run in place "
            f"(its data and results would be written there): run `quantem-flow run --example "
            f"{name} [--output-dir DIR]`, which copies it to DIR and writes its synthetic input"
        )


def _run(args: argparse.Namespace) -> int:
    from .pipeline import load_pipeline, prepare_pipeline, run_pipeline

    if (args.pipeline is None) == (args.example is None):
        raise ParameterError(
            "quantem-flow run takes a pipeline file or --example NAME (one of them), got "
            + ("both" if args.pipeline is not None else "neither")
        )
    output_dir = args.output_dir
    if args.example is not None:
        path, output_dir = _example_pipeline_file(args)
    else:
        path = Path(args.pipeline)
        _refuse_shipped_example(path)
    pipe = load_pipeline(path)
    targets = pipe.save_targets(output_dir)
    figures = None if args.no_figures else _figures_dir(targets, args.figures)
    replace = bool(args.overwrite or (pipe.save is not None and pipe.save.overwrite))
    _check_figures(list(pipe.outputs), figures, replace)
    # everything that needs no pixel data, before any cluster starts
    prepared = prepare_pipeline(
        pipe, output_dir=output_dir, overwrite=True if args.overwrite else None
    )
    client, where = _start_client(args.scheduler)
    try:
        _say(f"pipeline:  {pipe.origin}", f"input:     {pipe.input.path}", f"scheduler: {where}")
        _report_dashboard(client)
        _say(f"computing {', '.join(pipe.outputs)} in one pass ...")
        results = run_pipeline(
            prepared,
            client=None if args.scheduler is None else client,
            progress=not args.no_progress,
        )
    finally:
        _finish_client(client, args.scheduler)
    _report_results(results)
    _write_figures(results, figures)
    if targets.results is None and targets.json is None and not targets.png_files:
        _say("files: none written (the pipeline has no save section; pass --output-dir DIR)")
    else:
        _report_files(targets)
    return 0


def _pearson(a: Any, b: Any) -> float:
    import numpy as np

    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x = x[ok] - x[ok].mean()
    y = y[ok] - y[ok].mean()
    den = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / den) if den > 0 else math.nan


def _phase_check_figure(truth: Any, idpc: Any, ssb: Any, path: Path) -> Path:
    """The truth, the iDPC phase and the SSB phase side by side, each with its correlation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plotting import _png_metadata

    (row, col) = ssb.axes
    extent = (
        -0.5 * col.sampling,
        (col.size - 0.5) * col.sampling,
        (row.size - 0.5) * row.sampling,
        -0.5 * row.sampling,
    )
    panels = [
        ("truth (band-limited to the SSB band)", truth.phase, None),
        ("iDPC", idpc.data, _pearson(idpc.data, truth.phase)),
        ("SSB", ssb.phase, _pearson(ssb.phase, truth.phase)),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.0), layout="constrained")
    for ax, (title, values, r) in zip(axes, panels, strict=True):
        im = ax.imshow(values, cmap="gray", extent=extent, interpolation="nearest")
        ax.set_title(title if r is None else f"{title}: r = {r:.3f} with the truth", fontsize=10)
        ax.set_xlabel(f"scan column ({col.units})")
        ax.set_ylabel(f"scan row ({row.units})")
        unit = "rad" if title.startswith(("truth", "SSB")) else idpc.units
        fig.colorbar(im, ax=ax, label=f"phase ({unit})", shrink=0.85)
    quality = ssb.provenance.parameters.get("quality", {})
    fig.suptitle(
        f"Phase of the synthetic specimen. SSB double-overlap loss "
        f"{quality.get('double_overlap_loss', float('nan')):.2f} ({quality.get('verdict', '?')}; "
        "docs/ssb-quality.md)",
        fontsize=10,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata=_png_metadata())
    plt.close(fig)
    return path


def _demo(args: argparse.Namespace) -> int:
    from .pipeline import example_pipeline, load_pipeline, prepare_pipeline, run_pipeline
    from .synthetic import truth_of, write_synthetic

    params = DEMO_SIZES[args.size]
    out = Path(args.output_dir).expanduser().absolute()
    data_path = out / DEMO_DATA_NAME
    yaml_path = out / DEMO_PIPELINE_NAME
    template = example_pipeline("demo").read_text(encoding="utf-8")
    if not args.overwrite:
        import yaml

        planned_pipe = load_pipeline(yaml.safe_load(template), base_dir=out)
        planned = planned_pipe.save_targets()
        existing = [p for p in (data_path, yaml_path) if p.exists()] + planned.existing()
        if existing:
            raise ParameterError(
                f"{str(out)!r} already holds demo files ({[p.name for p in existing][:4]}); "
                "pass --overwrite to replace them or choose another --output-dir"
            )
        _check_figures(
            list(planned_pipe.outputs),
            out / "figures",
            False,
            remedy="pass --overwrite to replace them or choose another --output-dir",
        )
    R, C = params["scan_shape"]
    kr, kc = params["detector_shape"]
    _say(
        "quantem-flow demo: a synthetic weak-phase specimen (a lattice of atoms) scanned by a "
        "300 kV probe of 20 mrad semiangle, simulated with wave optics, with Poisson noise of "
        f"{params['dose_per_frame']:g} electrons per frame",
        f"writing synthetic 4D-STEM data: scan {R} x {C}, detector {kr} x {kc}, "
        f"{params['dtype']}, {_mib(R * C * kr * kc * 2)} ...",
    )
    write_synthetic(data_path, format="hdf5", overwrite=args.overwrite, **params)
    yaml_path.write_text(template, encoding="utf-8")
    pipe = load_pipeline(yaml_path)
    targets = pipe.save_targets()
    _say(
        f"data:      {data_path} (HDF5 /data, bitshuffle+LZ4, "
        f"{_mib(data_path.stat().st_size)} on disk)",
        f"pipeline:  {yaml_path}",
    )
    prepared = prepare_pipeline(pipe, overwrite=args.overwrite)  # before any cluster starts
    scheduler = "synchronous" if args.synchronous else None
    client, where = _start_client(scheduler)
    try:
        _say(f"scheduler: {where}")
        _report_dashboard(client)
        _say(f"computing {', '.join(pipe.outputs)} in one pass ...")
        results = run_pipeline(
            prepared, client=None if scheduler is None else client, progress=True
        )
    finally:
        _finish_client(client, scheduler)
    _report_results(results)
    truth = truth_of(**params)
    phase = results["idpc"]
    rot = phase.provenance.parameters.get("rotation", {})
    r_idpc = _pearson(phase.data, truth.phase)
    lines = [
        f"check:     iDPC phase vs the synthetic truth: Pearson r = {r_idpc:.3f} (means "
        f"removed); rotation found {rot.get('rotation_deg_found', float('nan')):.2f} deg "
        "(the truth is 0 deg, no transpose)"
    ]
    ssb: Any = results.get("ssb")
    if ssb is not None:
        r_ssb = _pearson(ssb.phase, truth.phase)
        quality = ssb.provenance.parameters.get("quality", {})
        lines.append(
            f"check:     SSB phase vs the synthetic truth: Pearson r = {r_ssb:.3f}; "
            f"{quality.get('reading', '')}"
        )
    _say(*lines)
    _write_figures(results, out / "figures")
    if ssb is not None:
        check = _phase_check_figure(truth, phase, ssb, out / "figures" / "phase_check.png")
        _say(f"figure:    {check} (truth, iDPC and SSB side by side)")
    _report_files(targets, extra=[("data", data_path), ("pipeline", yaml_path)])
    _say(f"rerun:     quantem-flow run {yaml_path} --overwrite")
    return 0


# -- convert ------------------------------------------------------------------------------
def _size_advice(ds: Any, kind: str, stored: int, on_disk: int) -> list[str]:
    """Lines saying when the output is larger than the input, and what would be smaller."""
    if on_disk <= 0 or stored <= 1.1 * on_disk:
        return []
    factor = stored / on_disk
    head = f"note:      the output is {factor:.1f}x the input's {_size(on_disk)} on disk; "
    if kind == "counted":
        n_frames = max(ds.shape[0] * ds.shape[1], 1)
        per_frame = stored / 4 / n_frames  # one uint32 pixel index per count
        return [
            head + f"a counted file stores one 4-byte event per count (about "
            f"{per_frame:,.0f} counts per frame here), which pays off only for sparse "
            "frames; for these data a compressed Zarr store is likely smaller: "
            "quantem-flow convert INPUT OUTPUT.zarr (--codec bitshuffle-lz4, lossless)"
        ]
    if ds.source.format == "counted":
        return [
            head + "the input is an electron-counted file, which stores sparse frames "
            "more compactly than dense chunks; keep it, or convert with --to counted"
        ]
    return [
        head + "the input is already compressed at least as well (the Zarr store adds "
        "per-chunk CRC-32C checksums and encoded reads, not space); keep the input, or try "
        "--codec bitshuffle-zstd"
    ]


def _convert(args: argparse.Namespace) -> int:
    from .convert import convert, output_kind
    from .io.base import path_size

    kind = output_kind(args.output, to=args.to)  # before the input is opened
    options = _input_options(args)
    if args.format is not None:
        options["format"] = args.format
    if kind == "counted":
        given = [
            flag
            for flag, value in (
                ("--codec", args.codec),
                ("--level", args.level),
                ("--frames-per-chunk", args.frames_per_chunk),
            )
            if value is not None
        ]
        if given:
            raise ParameterError(
                f"{', '.join(given)} apply to --to zarr only; a counted file stores events"
            )
        kwargs: dict[str, Any] = {}
    else:
        kwargs = {
            "codec": args.codec or "bitshuffle-lz4",
            "level": args.level,
            "frames_per_chunk": args.frames_per_chunk,
        }
    from . import open as open_dataset

    ds = open_dataset(args.input, **options)
    R, C, kr, kc = ds.shape
    on_disk = sum(path_size(p) for p in ds.source.identity.paths)
    _say(
        f"input:     {getattr(ds.source, 'path', args.input)} ({ds.source.format}, "
        f"({R}, {C}, {kr}, {kc}) {ds.dtype}, {_size(ds.nbytes)} decoded, {_size(on_disk)} "
        "on disk)",
        f"writing:   {kind} ...",
    )
    out = convert(ds, args.output, to=kind, overwrite=args.overwrite, **kwargs)
    stored = path_size(out)
    if kind == "zarr":
        import zarr

        attrs: dict[str, Any] = dict(zarr.open_array(store=str(out), mode="r").attrs)
        prov: dict[str, Any] = attrs["quantem_flow"]["provenance"]
        codecs = " + ".join(["bytes"] + [c["name"] for c in prov["zarr_codecs"]])
        chunk = " x ".join(str(v) for v in prov["chunks"])
        check = prov["exactness"]
        _say(
            f"wrote:     {out} (Zarr v3, array ({R}, {C}, {kr}, {kc}) {ds.dtype} at the root, "
            f"chunks {chunk}, codec {prov['codec']}: {codecs})",
            f"exact:     {check['chunks_verified']} stored chunks ({check['frames_verified']} "
            "frames) read back, decoded and compared byte for byte",
        )
    else:
        _say(f"wrote:     {out} (electron-counted HDF5)")
    ratio = ds.nbytes / stored if stored else math.inf
    _say(
        f"size:      {_size(ds.nbytes)} decoded, {_size(on_disk)} input on disk -> "
        f"{_size(stored)} written ({stored / on_disk if on_disk else math.inf:.2f}x the input; "
        f"compression ratio {ratio:.2f} of the decoded size)",
        *_size_advice(ds, kind, stored, on_disk),
    )
    return 0


# -- worker -------------------------------------------------------------------------------
def _worker_command(args: argparse.Namespace) -> list[str]:
    """Return the ``dask worker`` command line that ``quantem-flow worker`` runs."""
    from .graphs.worker import preload_argv
    from .runtimes import available_runtimes

    address = str(args.scheduler).strip()
    if not address or any(c.isspace() for c in address):
        raise ParameterError(
            f"SCHEDULER_ADDRESS must be an address such as tcp://127.0.0.1:8786, got {address!r}"
        )
    runtimes = None
    if args.runtimes is not None:
        runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
        from .runtimes.external.spec import register_requested

        register_requested(runtimes)  # webgpu, webgpu-browser: registered when named
        available = available_runtimes()
        missing = [r for r in runtimes if r not in available]
        if not runtimes or missing:
            raise ParameterError(
                f"--runtimes must list runtimes available on this machine, comma separated; "
                f"got {args.runtimes!r}, available: {','.join(sorted(available))}"
            )
    if args.nthreads is not None and args.nthreads < 1:
        raise ParameterError(f"--nthreads must be a positive integer, got {args.nthreads}")
    cmd = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        address,
        "--host",
        args.host,
        "--dashboard-address",
        args.dashboard_address,
        "--memory-limit",
        str(args.memory_limit),
    ]
    if args.nthreads is not None:
        cmd += ["--nthreads", str(args.nthreads)]
    if args.name is not None:
        cmd += ["--name", args.name]
    cmd += _tls_argv(args, address)
    cmd += ["--preload", "quantem_flow.graphs.worker"]
    cmd += preload_argv(runtimes=runtimes, budget_fraction=args.budget_fraction)
    return cmd


def _tls_argv(args: argparse.Namespace, address: str) -> list[str]:
    """``dask worker`` TLS options from --tls-ca-file/--tls-cert/--tls-key, checked."""
    files = {
        "--tls-ca-file": getattr(args, "tls_ca_file", None),
        "--tls-cert": getattr(args, "tls_cert", None),
        "--tls-key": getattr(args, "tls_key", None),
    }
    given = {k: v for k, v in files.items() if v is not None}
    if not given:
        if address.startswith("tls://"):
            raise ParameterError(
                f"the scheduler {address!r} speaks TLS but no certificates were given; pass "
                "--tls-ca-file CA.pem --tls-cert WORKER.pem --tls-key WORKER.key"
            )
        return []
    if "--tls-ca-file" not in given or "--tls-cert" not in given:
        raise ParameterError(
            f"TLS needs at least --tls-ca-file and --tls-cert (and --tls-key unless the key is "
            f"in the certificate file); got {sorted(given)}"
        )
    if not address.startswith("tls://"):
        raise ParameterError(
            f"TLS certificates were given but the scheduler address {address!r} is not "
            "tls://HOST:PORT; start the scheduler with TLS and give its tls:// address"
        )
    argv: list[str] = []
    for flag, value in given.items():
        path = Path(value).expanduser()
        if not path.is_file():
            raise ParameterError(f"{flag} {str(path)!r} is not a readable file")
        argv += [flag, str(path.resolve())]
    return argv


def _settings(items: list[str]) -> list[tuple[str, str]]:
    """``NAME=VALUE`` settings of ``--config``, checked."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ParameterError(
                f"--config takes NAME=VALUE (a qf.config setting), got {item!r}; for example "
                "--config external_timeout_s=60"
            )
        out.append((name.strip(), value.strip()))
    return out


def _worker(args: argparse.Namespace) -> int:
    import os
    import shlex
    import subprocess

    from . import config

    cmd = _worker_command(args)
    settings = dict(_settings(args.config or []))
    env = config.environment(settings)
    if getattr(args, "no_launch", False):
        # webgpu-browser prints its loopback URL (with a one-time token) instead of
        # starting headless Chromium
        env["QF_WEBGPU_BROWSER_LAUNCH"] = "0"
    if args.dry_run:
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(env.items()))
        _say(prefix + shlex.join(cmd))
        return 0
    # the variables reach the worker process (set only on the way to exec, so an
    # in-process call leaves this process unchanged)
    os.environ.update(env)
    _say(f"starting a quantem-flow worker for {args.scheduler} (Ctrl-C stops it)")
    if getattr(args, "no_launch", False):
        _say("webgpu-browser: the worker prints a loopback URL; open it in a browser with WebGPU")
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "posix":  # pragma: no cover - replaces this process
        os.execv(cmd[0], cmd)
    proc = subprocess.Popen(cmd)  # pragma: no cover - Windows
    try:  # pragma: no cover - Windows
        return proc.wait()
    except KeyboardInterrupt:  # pragma: no cover - Windows
        proc.terminate()
        return proc.wait()


def _version(args: argparse.Namespace) -> int:
    from . import __version__
    from .provenance import package_versions

    _say(f"quantem-flow {__version__}")
    if args.all:
        for name, version in package_versions().items():
            if name != "quantem-flow":
                _say(f"  {name} {version}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from distributed import Client

    from .bench import run_bench
    from .graphs.cluster import close_embedded_cluster

    client = Client(args.scheduler, set_as_default=False) if args.scheduler else None
    try:
        if client is None:
            from .graphs import embedded_client

            _report_dashboard(embedded_client())  # the same cluster run_bench uses
        else:
            _report_dashboard(client)
        report = run_bench(
            args.output_dir,
            scan_shape=(args.scan_shape[0], args.scan_shape[1]),
            detector_shape=(args.detector_shape[0], args.detector_shape[1]),
            repeat=args.repeat,
            client=client,
        )
    finally:
        if client is not None:
            client.close()
        else:
            close_embedded_cluster()
    _say(report.read_text())
    _say(f"report:  {report}")
    _say(f"json:    {report.with_name('report.json')}")
    _say(f"dask:    {report.with_name('dask-performance-report.html')}")
    return 0


# -- entry point --------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantem-flow",
        description="Task-graph engine for 4D-STEM data: inspect inputs, run YAML pipelines.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "live", help="receive a detector stream and run a pipeline on the scan (docs/live.md)"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dectris", metavar="tcp://HOST:PORT", help="a DECTRIS stream v2")
    source.add_argument("--merlin", metavar="tcp://HOST:PORT", help="a Merlin TCP data socket")
    p.add_argument("--scan", required=True, metavar="RxC", help="scan rows x columns, e.g. 256x256")
    p.add_argument(
        "pipeline", help="YAML pipeline (its input section gives calibration and chunking)"
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the received frames in DIR (live.json and the frames as they came)",
    )
    p.add_argument(
        "--keep-hdf5",
        metavar="FILE",
        help=(
            "also keep the series as HDF5 (bitshuffle+LZ4 chunks as the detector sent them); "
            "NAME_master.h5 writes DECTRIS's master and data files"
        ),
    )
    p.add_argument("--output-dir", help="folder for the pipeline's outputs")
    p.add_argument("--timeout", type=float, default=10.0, help="longest silence in the stream, s")
    p.add_argument(
        "--start-timeout", type=float, default=60.0, help="longest wait for the series, s"
    )
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="analyse a series with missing frames (they read as 0; every result says so)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace earlier outputs")
    p.add_argument(
        "--scheduler",
        help="scheduler address, 'threads' or 'synchronous' (this process; default: embedded)",
    )
    p.set_defaults(func=_live)

    p = sub.add_parser(
        "simulate",
        help="replay a dataset as a detector stream (DECTRIS stream v2), for live tests",
    )
    p.add_argument(
        "kind",
        choices=["dectris", "merlin"],
        help="the stream protocol (Merlin: its TCP data socket)",
    )
    p.add_argument("file", help="any readable 4D-STEM input")
    _add_input_options(p)
    p.add_argument(
        "--rate", type=float, default=None, help="frames per second (default: as fast as taken)"
    )
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:31001",
        help="where the stream's PUSH socket binds (default tcp://127.0.0.1:31001, DECTRIS's "
        "port; port 0: any free port)",
    )
    p.add_argument(
        "--compression", choices=["bslz4", "lz4", "none"], default="bslz4", help="image compression"
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a consumer")
    p.set_defaults(func=_simulate)

    p = sub.add_parser("info", help="describe a 4D-STEM input (reads no frames)")
    p.add_argument("file", help="data file or Zarr store")
    _add_input_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)

    p = sub.add_parser(
        "explore",
        help="explore a dataset in the browser: drag virtual detectors, watch the image follow",
    )
    p.add_argument("file", help="data file or Zarr store")
    _add_input_options(p)
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS|threads|synchronous",
        help="tcp://host:port of a running Dask scheduler, or 'threads' or 'synchronous' (this "
        "process); default: an embedded local cluster on 127.0.0.1",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to serve on (default 127.0.0.1: this machine only)",
    )
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    p.add_argument(
        "--export-dir",
        default="quantem-flow-explore",
        help="folder the Export button writes the pipeline, snippet and masks to",
    )
    p.add_argument(
        "--timeout", type=float, default=0, help="stop after this many seconds (0: never)"
    )
    p.set_defaults(func=_explore)

    p = sub.add_parser("run", help="run a YAML pipeline (docs/pipelines.md)")
    p.add_argument("pipeline", nargs="?", help="the pipeline .yaml file")
    p.add_argument(
        "--example",
        metavar="NAME",
        help="run a shipped example (demo, calibrated) instead: copied into --output-dir "
        "(default ./quantem-flow-NAME) with its synthetic input written there",
    )
    p.add_argument(
        "--output-dir",
        help="folder the save paths are relative to (default: the pipeline file's folder)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS|threads|synchronous",
        help="tcp://host:port of a running Dask scheduler, or 'threads' or 'synchronous' (this "
        "process); default: an embedded local cluster on 127.0.0.1",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    p.add_argument(
        "--figures",
        metavar="DIR",
        help="folder for the figures (default: figures/ beside the saved outputs)",
    )
    p.add_argument("--no-figures", action="store_true", help="write no matplotlib figures")
    p.set_defaults(func=_run)

    p = sub.add_parser("demo", help="write a synthetic dataset and analyse it end to end")
    p.add_argument(
        "--output-dir",
        default="quantem-flow-demo",
        help="folder for the data and results (default: ./quantem-flow-demo)",
    )
    p.add_argument(
        "--size",
        choices=sorted(DEMO_SIZES),
        default="small",
        help="small: 48 x 64 scan (28 MiB); medium: 128 x 128 scan (288 MiB)",
    )
    p.add_argument(
        "--synchronous",
        action="store_true",
        help="compute in this process instead of the embedded local cluster",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier demo's files")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "convert",
        help="write a dataset losslessly to a compressed Zarr v3 store or a counted file",
    )
    p.add_argument("input", metavar="INPUT", help="data file or Zarr store")
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="OUTPUT.zarr (a Zarr store, a directory) or OUTPUT.h5 with --to counted",
    )
    _add_input_options(p)
    p.add_argument(
        "--to",
        choices=("zarr", "counted"),
        help="output kind: a compressed Zarr v3 store, or an electron-counted HDF5 file "
        "(default: zarr for an OUTPUT named .zarr; other names need --to)",
    )
    p.add_argument(
        "--codec",
        choices=("zstd", "lz4", "bitshuffle-lz4", "bitshuffle-zstd"),
        help="Zarr compression (default bitshuffle-lz4); every chunk also gets a CRC-32C",
    )
    p.add_argument(
        "--level",
        type=int,
        help="zstd level (default 3), or blosc clevel 0-9 for the other codecs",
    )
    p.add_argument(
        "--frames-per-chunk",
        type=int,
        help="frames per stored Zarr chunk (default: whole frames filling ~1 MiB)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.set_defaults(func=_convert)

    p = sub.add_parser(
        "worker",
        help="run a Dask worker that advertises this machine's runtimes (until interrupted)",
    )
    p.add_argument("scheduler", metavar="SCHEDULER_ADDRESS", help="e.g. tcp://127.0.0.1:8786")
    p.add_argument(
        "--runtimes",
        "--runtime",
        dest="runtimes",
        metavar="NAMES",
        help="comma-separated runtimes to advertise, e.g. cpu,mps (default: every available "
        "built-in one); the external runtimes (webgpu, webgpu-browser, vulkan, swift) are "
        "advertised only when named",
    )
    p.add_argument(
        "--no-launch",
        action="store_true",
        help="webgpu-browser: start no headless Chromium; print the loopback URL for a person "
        "to open in their own browser instead",
    )
    p.add_argument("--nthreads", type=int, help="threads (default: one per core)")
    p.add_argument(
        "--memory-limit",
        default="auto",
        help="bytes, e.g. '8 GiB', or 'auto' (default) for this machine's RAM",
    )
    p.add_argument("--name", help="worker name (default: its address)")
    p.add_argument(
        "--tls-ca-file",
        metavar="CA.pem",
        help="CA certificate for TLS (scheduler address tls://HOST:PORT); with --tls-cert and "
        "--tls-key every connection is encrypted and mutually authenticated",
    )
    p.add_argument("--tls-cert", metavar="CERT.pem", help="this worker's TLS certificate")
    p.add_argument("--tls-key", metavar="KEY.pem", help="this worker's TLS private key")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the worker listens on (default: 127.0.0.1, this machine only)",
    )
    p.add_argument(
        "--dashboard-address",
        default="127.0.0.1:0",
        help="the worker's dashboard (default: 127.0.0.1, a free port)",
    )
    p.add_argument(
        "--budget-fraction",
        type=float,
        default=0.8,
        help="share of memory admitted for resident payloads (default 0.8)",
    )
    p.add_argument(
        "--config",
        action="append",
        metavar="NAME=VALUE",
        help="a qf.config setting for the worker process (repeatable), e.g. "
        "--config external_timeout_s=60 --config external_stall_grace_s=5 (the external "
        "workers' timeouts) or --config no_worker_timeout_s=120",
    )
    p.add_argument("--dry-run", action="store_true", help="print the dask worker command and exit")
    p.set_defaults(func=_worker)

    p = sub.add_parser(
        "bench", help="measure this machine and cluster and write a performance report"
    )
    p.add_argument(
        "--output-dir",
        default="quantem-flow-bench",
        help="folder for the synthetic data and the report (default: ./quantem-flow-bench)",
    )
    p.add_argument("--scan-shape", nargs=2, type=int, default=(128, 128), metavar=("R", "C"))
    p.add_argument("--detector-shape", nargs=2, type=int, default=(128, 128), metavar=("KR", "KC"))
    p.add_argument("--repeat", type=int, default=3, help="timed runs per measurement")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="tcp://host:port of a running scheduler (default: an embedded local cluster)",
    )
    p.set_defaults(func=_bench)

    p = sub.add_parser("version", help="print the version")
    p.add_argument("--all", action="store_true", help="also the versions of the dependencies")
    p.set_defaults(func=_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``quantem-flow`` command line.

    Parameters
    ----------
    argv
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 for a usage or quantem-flow error (one line on
        stderr).
    """
    parser = _parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help or a usage error: argparse has printed it
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USER_ERROR
    try:
        code: int = args.func(args)
    except (QuantemFlowError, FileExistsError) as exc:
        message = " ".join(str(exc).split())
        if args.command in ("info", "convert"):
            message = cli_terms(message)
        print(f"quantem-flow {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
