#!/usr/bin/env bash
# The device check for the CUDA runtime (issue 29), about 7 minutes on one H200:
#   1. the carried wheels (dask, distributed, zarr, hdf5plugin... that the GPU
#      image lacks) install into /tmp/site;
#   2. nvcc compiles every raw CUDA kernel for sm_90;
#   3. every CUDA-marked test runs (the runtime conformance suite on every
#      representation and dtype, placement, the engine, SSB's CUDA-vs-CPU test):
#      none may skip;
#   4. bench_gpu.py: parity with the CPU runtime, then timings on a resident
#      512 x 512 x 192 x 192 u16 dataset (18 GiB, generated on the device), the
#      CPU runtime on the same machine beside it, paired/packed/encoded
#      against dense, loading 8 GiB from the page cache;
#   5. bench_gpu_ssb.py: SSB 256 x 256 and 512 x 512 on CUDA and on the CPU.
# Each step has its own time limit and writes to $OUT, so one that fails or
# runs long leaves the others' results.
#
# Here (a machine with PyPI):  bash benchmarks/gpu_wheels.sh
# Then through the device tool: run(command="bash benchmarks/gpu_check.sh",
#                                    carry=[".whl"], timeout_s=480)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qf-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
start=$SECONDS
stamp() { echo "== [$((SECONDS - start)) s] $*"; }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  nproc
  python3 -c "import sys, numpy, numba, cupy, dask, distributed; \
print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, \
'cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), \
'dask', dask.__version__)"
  python3 -c "from quantem_flow.runtimes.cuda import CudaRuntime; print(CudaRuntime.available())"
} 2>&1 | tee "$OUT/machine.txt"

stamp "nvcc compile of every raw kernel"
timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_sources.py 2>&1 \
  | tail -5 | tee "$OUT/cuda_sources.txt"

stamp "every CUDA-marked test (none may skip)"
timeout 170 python3 -m pytest -q -p no:cacheprovider -m cuda -rs -n 8 --timeout 120 \
  -W ignore::pytest.PytestUnraisableExceptionWarning tests/ >"$OUT/cuda_tests.txt" 2>&1
echo "pytest exit $?" >>"$OUT/cuda_tests.txt"
grep -E "passed|failed|error|SKIPPED|FAILED|ERROR|exit" "$OUT/cuda_tests.txt" | tail -25

stamp "timings: resident dense, representations, load (bench_gpu.py)"
timeout 120 python3 benchmarks/bench_gpu.py --json "$OUT/bench_gpu.json" 2>&1 \
  | tee "$OUT/bench_gpu.txt" | grep -v "^\s*$" | tail -40

stamp "SSB 256 and 512 on CUDA and on the CPU (bench_gpu_ssb.py)"
timeout 110 python3 benchmarks/bench_gpu_ssb.py --json "$OUT/bench_gpu_ssb.json" 2>&1 \
  | tee "$OUT/bench_gpu_ssb.txt" | tail -20
stamp "done"
