#!/usr/bin/env bash
# Builds the sweeps of diagonal_matmul, fused_linear_rowsum and dropout (dev/sweep_<family>.cu) and
# runs them with their default shapes (the bench shapes of python/kernelforge/specs/<family>.py,
# forward and backward, bf16): one line per (shape, direction, plan) with us, GB/s and % of
# copy@size, "*" on the planner's default. Run on the GPU machine from the repository root:
#
#   dev/sweep_new_families.sh                       (configures _build/dev if it has no build yet)
#   KF_BUILD_DIR=_build/x dev/sweep_new_families.sh (an existing build dir: KF_BUILD_DEV is turned on)
#   DM_ARGS="dtype=fp32" FLRS_ARGS="all=1" DROP_ARGS="ops=dropout,add" dev/sweep_new_families.sh
#
# Arguments of each program: see the comment at the top of its .cu file.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KF_BUILD_DIR:-_build/dev}
if [ -f "$build/CMakeCache.txt" ]; then
  cmake "$build" -DKF_BUILD_DEV=ON >/dev/null
else
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKF_BUILD_DEV=ON \
    -DKF_CUDA_ARCHS="${KF_CUDA_ARCHS:-90a-real}" >/dev/null
fi
cmake --build "$build" -j "${KF_JOBS:-$(nproc)}" \
  --target sweep_diagonal_matmul sweep_fused_linear_rowsum sweep_dropout >/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
# shellcheck disable=SC2086  # the *_ARGS are word lists
"$build/dev/sweep_diagonal_matmul" ${DM_ARGS:-}
# shellcheck disable=SC2086
"$build/dev/sweep_fused_linear_rowsum" ${FLRS_ARGS:-}
# shellcheck disable=SC2086
"$build/dev/sweep_dropout" ${DROP_ARGS:-}
