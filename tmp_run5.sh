#!/usr/bin/env bash
O=$OUT/full
mkdir -p $O
export KF_COMMIT=$(cat .commit)
KF_DEADLINE=590 bash scripts/gpu_run.sh $O build ctest pytest check sanitizer 2>&1 | tail -25
