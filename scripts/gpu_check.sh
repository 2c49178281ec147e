#!/usr/bin/env bash
# One prepared check for a lent GPU machine (no internet; its image has PyTorch cu13x, nvcc 13,
# pybind11, pytest): build byteps_thc._C in place with the CUDA kernels using the system python3
# (not .venv), run tests/unit (tests/unit/test_cuda.py first), run benchmarks/bench_cuda.py, and
# write a log and JSON results into OUTDIR. About 4-6 minutes on one H200 with 16 cores. (The CPU
# emulation tests of test_cuda.py are left out there: the GPU runs the kernels themselves.)
#
#   scripts/gpu_check.sh OUTDIR
#
# OUTDIR gets: gpu_check.log, junit_cuda.xml, junit_unit.xml, bench.json, summary.json.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
exec > >(tee "$LOG") 2>&1
export PATH="/usr/local/cuda/bin:$PATH" PYTHONDONTWRITEBYTECODE=1 THC_CUDA=1
T0=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - T0 )) s)"; }

step "machine"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv || true
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
nvcc --version | tail -n 2
# Only this GPU's architecture: a quicker build (CI and wheels build them all).
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
export THC_CUDA_ARCHS=${THC_CUDA_ARCHS:-${CAP:-90}} THC_CUDA_JOBS=${THC_CUDA_JOBS:-8}
echo "THC_CUDA_ARCHS=$THC_CUDA_ARCHS"

step "build (setup.py build_ext --inplace, -j 16)"
rm -rf build/temp.* byteps_thc/_C*.so
B0=$(date +%s)
timeout 300 "$PY" setup.py -q build_ext --inplace -j 16
BUILD_RC=$?
BUILD_S=$(( $(date +%s) - B0 ))
echo "build rc=$BUILD_RC in ${BUILD_S} s"
"$PY" -c 'from byteps_thc import _C; from byteps_thc.thc import cuda; print("with_cuda", _C.with_cuda, "devices", _C.cuda.device_count(), _C.cuda.device_name(0))' || BUILD_RC=1

CUDA_RC=99; UNIT_RC=99; BENCH_RC=99
if [ "$BUILD_RC" = 0 ]; then
  step "tests/unit/test_cuda.py"
  timeout 300 "$PY" -m pytest -p no:cacheprovider -q -rfEs tests/unit/test_cuda.py \
      -k "not emulated" --junitxml="$OUT/junit_cuda.xml" --durations=8
  CUDA_RC=$?
  step "the rest of tests/unit"
  timeout 120 "$PY" -m pytest -p no:cacheprovider -q -rfE tests/unit \
      --ignore=tests/unit/test_cuda.py --junitxml="$OUT/junit_unit.xml"
  UNIT_RC=$?
  step "benchmarks/bench_cuda.py"
  timeout 150 "$PY" benchmarks/bench_cuda.py --json "$OUT/bench.json"
  BENCH_RC=$?
fi

step "summary"
"$PY" - "$OUT" "$BUILD_RC" "$BUILD_S" "$CUDA_RC" "$UNIT_RC" "$BENCH_RC" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, build_rc, build_s, cuda_rc, unit_rc, bench_rc = sys.argv[1], *map(int, sys.argv[2:])
def junit(name):
    p = Path(out) / name
    if not p.exists():
        return None
    suites = ET.parse(p).getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites)
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}
bench = Path(out) / "bench.json"
b = json.loads(bench.read_text()) if bench.exists() else {}
summary = {"gpu": b.get("gpu"), "build_rc": build_rc, "build_seconds": build_s,
           "test_cuda_rc": cuda_rc, "test_cuda": junit("junit_cuda.xml"),
           "unit_rc": unit_rc, "unit": junit("junit_unit.xml"), "bench_rc": bench_rc,
           "goal_encode_decode_le_1.5x": b.get("goal_encode_decode_le_1.5x")}
(Path(out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PYEOF
echo "total $(( $(date +%s) - T0 )) s"
[ "$BUILD_RC" = 0 ] && [ "$CUDA_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
