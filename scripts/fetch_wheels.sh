#!/usr/bin/env bash
# Downloads into .whl/ (ignored by git) the pure-Python wheels that a GPU machine without network
# access lacks and the tests or the bench need there: diffusers (the diffusers patch tests, which
# KF_REQUIRE_GPU=1 turns from skips into failures when it is missing) with importlib_metadata, and
# Liger-Kernel (a bench peer). scripts/gpu_run.sh installs whatever .whl/ holds into /tmp/site;
# carry .whl with the working tree. Run here, where PyPI is reachable:
#
#   scripts/fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# CPython 3.12 on x86-64 Linux (the GPU machine's python3); every wheel here is pure Python.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
  diffusers==0.42.1 importlib-metadata==8.7.0 liger-kernel==0.8.5
ls -1 .whl
