#!/usr/bin/env bash
O=$OUT/r2
mkdir -p $O
export KF_COMMIT=$(cat .commit)
KF_CTEST_ARGS="-R 'norm_gpu|rope_gpu'" bash scripts/gpu_run.sh $O build ctest
( KF_TUNE=bulk_min_row=0,bulk_min_waves=0 timeout 120 compute-sanitizer --tool memcheck _build/dev/tests/cpp/kf_tests --gtest_filter='*NormGpu/*:*NormGpuAda/*' 2>&1 | tail -5 ) | tee -a $O/log.txt
for t in default bulk_slice=65536,bulk_smem=131072 bulk_slice=16384; do
  KF_TUNE=$([ $t = default ] || echo $t) KF_PYDIR=python timeout 100 python3 scripts/prof_norm.py --fwd-only --shapes 4096x65536,2048x131072 --ops rms_norm,layer_norm,add_rms_norm,ada_norm 2>&1 | tee -a $O/norm_sweep.txt
done
KF_BENCH_ARGS="rms_norm layer_norm --shapes 4096x65536,2048x131072" bash scripts/gpu_run.sh $O/b bench
