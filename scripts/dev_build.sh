#!/usr/bin/env bash
# Developer build: core library + torch extension + C++ tests in _build/dev, and a copy of the
# extension next to the Python package so `PYTHONPATH=python` works without installing.
#   KF_CUDA_ARCHS=90a-real scripts/dev_build.sh      (one arch: much faster to compile)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KF_BUILD_DIR:-_build/dev}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKF_BUILD_TORCH=ON -DKF_BUILD_TESTS=ON \
  -DKF_TORCH_INSTALL_DIR=kernelforge -DKF_CUDA_ARCHS="${KF_CUDA_ARCHS:-90a-real}" \
  -DPython3_EXECUTABLE="$(command -v python3)" ${KF_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "${KF_JOBS:-$(nproc)}"
cp -f "$build/torch/libkernelforge_torch.so" python/kernelforge/libkernelforge_torch.so
echo "built: $build ; extension copied to python/kernelforge/"
