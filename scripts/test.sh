#!/usr/bin/env bash
# Runs every kernelforge test: the one command (README, CI).
#
#   scripts/test.sh
#
# 1. configure + build the core library and the C++ tests (GoogleTest) in $KF_TEST_BUILD_DIR
# 2. ctest: reference checks and validation (CPU), kernel tests (GPU; skipped without one)
# 3. cmake --install to a temporary prefix, then build and run examples/cpp against it
#    (find_package(kernelforge)), the way a C++ user consumes the package
# 4. python3 -m pytest tests/python -q
#
# Environment:
#   KF_CUDA_ARCHS       CUDA architectures (default: the CMake default 75-real;80-real;90a-real,
#                       i.e. every supported arch is compiled); 90a-real alone builds ~3x faster
#   KF_REQUIRE_GPU=1    a missing GPU fails the GPU tests instead of skipping them
#   KF_TEST_PYTHON      which kernelforge the Python tests import:
#                         source    (default) build the torch extension here too, copy it into
#                                   python/kernelforge/ and run with PYTHONPATH=python
#                         installed the pip-installed package (`pip install --no-build-isolation .`;
#                                   CI does this)
#                         none      skip the Python tests
#   KF_GTEST_SOURCE_DIR GoogleTest sources to build when none is installed (e.g. a copy of
#                       Debian's /usr/src/googletest); a carried .gtest/ in the repo is used too
#   KF_TEST_BUILD_DIR   build directory (default _build/test); KF_JOBS build jobs (default nproc)
#   KF_PYTEST_ARGS      extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

archs=${KF_CUDA_ARCHS:-75-real;80-real;90a-real}
build=${KF_TEST_BUILD_DIR:-_build/test}
jobs=${KF_JOBS:-$(nproc)}
py_mode=${KF_TEST_PYTHON:-source}
python=$(command -v python3)
t_start=$(date +%s)

step() { printf '\n==> [%4ss] %s\n' "$(($(date +%s) - t_start))" "$*"; }
die() { echo "scripts/test.sh: $*" >&2; exit 1; }
# Test steps keep going after a failure (every result is reported); the exit status says if any failed.
failed=()
check() {
  local name=$1
  shift
  if "$@"; then echo "--> $name: passed"; else echo "--> $name: FAILED"; failed+=("$name"); fi
}

case $py_mode in source | installed | none) ;; *) die "KF_TEST_PYTHON must be source, installed or none, got '$py_mode'" ;; esac

step "kernelforge tests: archs '$archs', build dir $build, python tests: $py_mode, KF_REQUIRE_GPU=${KF_REQUIRE_GPU:-0}"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi -L
else
  echo "no NVIDIA GPU visible: GPU tests $([[ ${KF_REQUIRE_GPU:-0} == 1 ]] && echo FAIL || echo 'are skipped')"
fi

# ---- 1. configure + build ----------------------------------------------------------------------
cmake_args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKF_BUILD_TESTS=ON "-DKF_CUDA_ARCHS=$archs")
[[ -f $build/CMakeCache.txt ]] || { command -v ninja >/dev/null && ninja --version >/dev/null 2>&1 && cmake_args+=(-G Ninja); }
gtest_src=${KF_GTEST_SOURCE_DIR:-}
[[ -z $gtest_src && -f $root/.gtest/CMakeLists.txt ]] && gtest_src=$root/.gtest
[[ -n $gtest_src ]] && cmake_args+=("-DKF_GTEST_SOURCE_DIR=$(cd "$gtest_src" && pwd)")
if [[ $py_mode == source ]]; then
  cmake_args+=(-DKF_BUILD_TORCH=ON -DKF_TORCH_INSTALL_DIR=kernelforge "-DPython3_EXECUTABLE=$python")
else
  cmake_args+=(-DKF_BUILD_TORCH=OFF)
fi
step "configure: cmake ${cmake_args[*]}"
cmake "${cmake_args[@]}"
step "build (-j $jobs)"
cmake --build "$build" -j "$jobs"

# ---- 2. C++ tests ------------------------------------------------------------------------------
step "ctest"
check ctest ctest --test-dir "$build" --output-on-failure

# ---- 3. install + example ----------------------------------------------------------------------
prefix=$(mktemp -d "${TMPDIR:-/tmp}/kernelforge-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
step "install to $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
find "$prefix" -type f | sed "s|^$prefix/|  |" | sort
step "example: examples/cpp built against the installed package"
example() {
  cmake -S examples/cpp -B "$prefix/_example" "-DCMAKE_PREFIX_PATH=$prefix" >/dev/null &&
    cmake --build "$prefix/_example" && "$prefix/_example/kf_example"
}
check example example

# ---- 4. Python tests ---------------------------------------------------------------------------
case $py_mode in
  source)
    cp -f "$build/torch/libkernelforge_torch.so" python/kernelforge/libkernelforge_torch.so
    export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
    ;;
  installed)
    # run from a directory outside the checkout so that the import cannot pick up python/
    where=$(cd / && "$python" -c 'import kernelforge, os; print(os.path.dirname(kernelforge.__file__))') ||
      die "KF_TEST_PYTHON=installed but 'import kernelforge' fails: run 'pip install --no-build-isolation .' first"
    [[ $where == "$root/python/"* ]] && die "KF_TEST_PYTHON=installed but kernelforge resolves to the source tree ($where)"
    ;;
esac
if [[ $py_mode != none ]]; then
  where=$("$python" -c 'import kernelforge, os; print(os.path.dirname(kernelforge.__file__))')
  step "pytest tests/python (kernelforge from $where)"
  # shellcheck disable=SC2086
  check pytest "$python" -m pytest tests/python -q ${KF_PYTEST_ARGS:-}
fi

if [[ ${#failed[@]} -gt 0 ]]; then
  step "FAILED: ${failed[*]}"
  exit 1
fi
step "all tests passed"
