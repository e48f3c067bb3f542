#!/usr/bin/env bash
# Run HERE (a machine with PyPI) before a device run: downloads the Python 3.12
# x86-64 wheels the GPU machine lacks into .whl/ (ignored by git), to be carried
# with `run(carry=[".whl"])`. The GPU image already has numpy, numba, h5py,
# cupy-cuda13x, scipy, pyyaml, pillow, tqdm, click, msgpack, psutil, toolz,
# cloudpickle, fsspec, jinja2, sortedcontainers, xxhash, matplotlib, pytest and
# pytest-xdist (KINDS.md in the device tool's library lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
dl() {
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$@"
}
dl "dask==2026.8.0" "distributed==2026.8.0" "hdf5plugin==7.1.0" "zarr==3.1.6" \
   "numcodecs==0.16.6" "bitshuffle==0.5.2" partd locket tblib zict tornado donfig \
   google-crc32c importlib_metadata lazy-importer platformdirs
# The run carries at most 64 MiB with the working tree: drop hdf5plugin's
# filters that no device check reads (SZ, SZ3, SPERR, HTJ2K, FCIDECOMP: 130 MB
# unpacked); importing hdf5plugin then logs "Cannot initialize filter ...".
zip -q -d .whl/hdf5plugin-*.whl 'hdf5plugin/plugins/libh5sz3.so' 'hdf5plugin/plugins/libh5sz.so' \
  'hdf5plugin/plugins/libh5sperr.so' 'hdf5plugin/plugins/libh5htj2k.so' \
  'hdf5plugin/plugins/libh5fcidecomp.so'
ls -la .whl
du -sh .whl
