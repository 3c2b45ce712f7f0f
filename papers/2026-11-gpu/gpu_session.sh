#!/usr/bin/env bash
# Run ON THE DEVICE MACHINE (H100/H200), from the repo root, in one device-tool call of <= 10 min:
#   prepare here first:  bash papers/2026-11-gpu/prepare_carry.sh
#   then:                run(command="bash papers/2026-11-gpu/gpu_session.sh", carry=[".gpu_carry"], timeout_s=600)
# Installs nothing from the network (the machine has none): the wheels in .gpu_carry/ go to
# /tmp/site, the repo is used from the checkout (PYTHONPATH, as the tests' pythonpath does), and
# the image's python3 brings numpy, sympy, torch, cupy, cuda-bindings and pytest. Then:
#   1. a smoke call (device, one kernel with NumPy and torch tensors),
#   2. pytest -m gpu tests/gpu (the public corpus on the GPU, torch/CuPy in and out, errors; not the
#      --quick benchmark test: step 3 runs the benchmark itself),
#   3. papers/2026-11-gpu/run.py (full sizes; --quick when SESSION_QUICK=1),
# each under its own time limit, everything written under $OUT (session.log, pytest.log, junit.xml,
# bench/results.{json,md}, bench/plot.png). SANITIZE=1 adds a compute-sanitizer memcheck run of
# some device tests (sanitizer.log) before the benchmark.
set -uo pipefail
OUT=${OUT:-/tmp/tl-gpu-session}
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
PY=${PY:-python3}
echo "== $(date -u) on $(hostname); commit $(cat .gpu_carry/commit.txt 2>/dev/null || echo '?')"
nvidia-smi -L 2>&1 | head -4 || true
"$PY" --version

echo "== install (offline)"
if ls .gpu_carry/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu_carry/*.whl \
    || echo "WARNING: wheel install failed"
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-12; do
  if [ -n "$d" ] && [ -x "$d/bin/ptxas" ]; then export CUDA_HOME="$d"; break; fi
done
if [ -f .gpu_carry/public.json ] && [ ! -f ../shared/tc_corpus/public.json ]; then
  mkdir -p ../shared/tc_corpus && cp .gpu_carry/public.json ../shared/tc_corpus/public.json
fi
"$PY" - <<'PY'
import importlib.metadata as m
for name in ("numpy", "llvmlite", "islpy", "sympy", "platformdirs", "cuda-bindings", "torch", "cupy-cuda13x", "pytest"):
    try:
        print(f"  {name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"  {name} MISSING")
import llvmlite, islpy
print("  llvmlite from", llvmlite.__file__, "| islpy from", islpy.__file__)
PY
echo "  CUDA_HOME=${CUDA_HOME:-unset}  [$(elapsed) s]"

echo "== smoke"
timeout 120 "$PY" - <<'PY'
import time, numpy as np, tensorlang as tl
from codegen.gpu import runtime
print("  unavailable_reason:", runtime.unavailable_reason())
dev = runtime.device(0)
print("  device:", dev)
t = time.perf_counter()
k = tl.compile("def f(float(N) a) -> (o) { o(i) = a(i) * 2 + 1 }", target="cuda")
a = np.arange(1000, dtype=np.float32)
got = k(a)
print("  numpy call ok:", bool(np.array_equal(got, a * 2 + 1)), f"{time.perf_counter() - t:.3f} s (first call)")
t = time.perf_counter(); k(a); print(f"  second call {1e6 * (time.perf_counter() - t):.0f} us")
import torch
x = torch.arange(1000, dtype=torch.float32, device="cuda")
y = k(x)
print("  torch call ok:", type(y).__name__, bool(torch.equal(y, x * 2 + 1)))
g = tl.compile("def emb(float(V,E) T, int32(B) I) -> (O) { O(b,e) = T(I(b), e) }", target="cuda")
try:
    g(np.ones((4, 2), np.float32), np.array([0, 9], np.int32))
    print("  gather error: NOT RAISED")
except tl.ArgumentError as exc:
    print("  gather error ok:", str(exc)[:100])
PY
echo "  smoke rc=$?  [$(elapsed) s]"

echo "== pytest -m gpu tests/gpu"
timeout "${PYTEST_LIMIT:-240}" "$PY" -m pytest -m gpu tests/gpu -k "not test_quick_run_on_the_gpu" -q -rfEs --tb=short -p no:cacheprovider \
  --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/pytest.log" | tail -60
echo "  pytest rc=${PIPESTATUS[0]}  [$(elapsed) s]"

if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  # the generated code never accesses out of bounds: memcheck over a few corpus kernels and gathers
  echo "== compute-sanitizer memcheck"
  timeout "${SANITIZE_LIMIT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$PY" -m pytest -m gpu tests/gpu/test_gpu_device.py -q -x -p no:cacheprovider \
    -k "gather or matmul or softmax or conv or large" > "$OUT/sanitizer.log" 2>&1
  rc=$?; tail -8 "$OUT/sanitizer.log"; echo "  sanitizer rc=$rc  [$(elapsed) s]"
fi

left=$(( ${SESSION_LIMIT:-570} - $(elapsed) ))
echo "== benchmark (${left} s left)"
if (( left > 60 )); then
  QUICK=""; [ "${SESSION_QUICK:-0}" = 1 ] && QUICK="--quick"
  timeout $(( left - 15 )) "$PY" papers/2026-11-gpu/run.py $QUICK --out "$OUT/bench" --budget "${BENCH_BUDGET:-8}" ${BENCH_ONLY:+--only "$BENCH_ONLY"}
  echo "  run.py rc=$?  [$(elapsed) s]"
else
  echo "  skipped: too little time left"
fi
echo "== done [$(elapsed) s]; files under $OUT:"; ls -R "$OUT"
