#!/usr/bin/env bash
# Developer tool (not part of the test or bench path): build a few variants of the extension that
# differ in compile-time flags, in parallel, then time the forward kernels of each under several
# KF_TUNE settings (each in its own process: KF_TUNE is read once), plus one peer run and Nsight
# Compute sections. Everything lands in OUTDIR/sweep.txt; the last lines are the table.
#   scripts/gpu_sweep.sh OUTDIR
# Environment: KF_SWEEP_FLAGS="name:FLAGS;..." build variants (FLAGS go to CMAKE_CUDA_FLAGS),
#   KF_SWEEP_TUNES="t1;t2;..." tune settings, KF_SWEEP_SHAPES, KF_SWEEP_NCU=1 to profile.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
flags=${KF_SWEEP_FLAGS:-"m1:-DKF_FWD_MINB=1"}
shapes=${KF_SWEEP_SHAPES:-16384x2048,16384x4096,16384x8192}
IFS=';' read -ra variants <<<"$flags"
pids=()
for v in "${variants[@]}"; do
  name=${v%%:*}; f=${v#*:}
  (cmake -S . -B "_build/sw_$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKF_BUILD_TORCH=ON -DKF_BUILD_TESTS=OFF \
     -DKF_CUDA_ARCHS=90a-real -DCMAKE_CUDA_FLAGS="$f" -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null &&
   cmake --build "_build/sw_$name" -j 16 >"$out/build_$name.log" 2>&1 &&
   rm -rf "/tmp/py_$name" && cp -r python "/tmp/py_$name" &&
   cp "_build/sw_$name/torch/libkernelforge_torch.so" "/tmp/py_$name/kernelforge/") &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "!! a build failed" | tee -a "$out/sweep.txt"; done
first=${variants[0]%%:*}
if [[ ${KF_SWEEP_PEERS:-1} == 1 ]]; then
  KF_PYDIR=/tmp/py_$first python3 scripts/gpu_smoke.py --time-only --fwd-only --shapes "$shapes" 2>&1 |
    sed "s/^/[peers $first] /" | tee -a "$out/sweep.txt"
fi
IFS=';' read -ra tunes <<<"${KF_SWEEP_TUNES:-fwd_persist=0}"
for v in "${variants[@]}"; do
  name=${v%%:*}
  [[ -f /tmp/py_$name/kernelforge/libkernelforge_torch.so ]] || continue
  for t in "${tunes[@]}"; do
    KF_TUNE="$t" KF_PYDIR=/tmp/py_$name python3 scripts/gpu_smoke.py --time-only --kf-only --fwd-only \
      --shapes "$shapes" 2>&1 | grep -v "^d2d" | sed "s/^/[$name $t] /" | tee -a "$out/sweep.txt"
  done
done
if [[ ${KF_SWEEP_NCU:-0} == 1 ]]; then
  for sh in ${KF_NCU_SHAPES:-16384x2048 16384x4096}; do
    KF_TUNE=${KF_NCU_TUNE:-fwd_persist=0,bulk=0} KF_PYDIR=/tmp/py_$first timeout 120 ncu --clock-control none \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis python3 scripts/ncu_fwd.py "$sh" >"$out/ncu_$sh.txt" 2>&1
    grep -E "norm|rms|layer|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Stall|L2 Hit|Waves" \
      "$out/ncu_$sh.txt" | head -150 >"$out/ncu_${sh}_short.txt"
  done
fi
echo "==== summary"
grep "GB/s" "$out/sweep.txt"
if [[ -n ${KF_SWEEP_CHECK:-} ]]; then
  KF_TUNE=$KF_SWEEP_CHECK KF_PYDIR=/tmp/py_$first timeout 150 python3 scripts/gpu_smoke.py --check-only 2>&1 |
    grep -v "^ok" | tail -20
fi
