#!/usr/bin/env bash
O=$OUT/bench
mkdir -p $O
export KF_COMMIT=$(cat .commit)
KF_BENCH_ARGS="silu_and_mul swiglu geglu apply_rope" KF_CTEST_ARGS="-R 'ce_gpu|norm_gpu_bulk'" KF_DEADLINE=560 bash scripts/gpu_run.sh $O build ctest bench 2>&1 | tail -70
