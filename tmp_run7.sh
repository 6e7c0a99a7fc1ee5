#!/usr/bin/env bash
O=$OUT/r7
mkdir -p $O
export KF_COMMIT=$(cat .commit)
bash scripts/gpu_run.sh $O build > /dev/null 2>&1; tail -3 $O/log.txt
for t in sm_keep_e=1 sm_bulk_1024=1 sm_bulk_1024=1,sm_keep_e=1; do
  KF_REQUIRE_GPU=1 KF_TUNE=sm_bulk_min_row=0,sm_bulk_min_rows=0,$t timeout 100 _build/dev/tests/cpp/kf_tests --gtest_filter='*SoftmaxGpu*' 2>&1 | tail -3 | sed "s/^/$t: /" | tee -a $O/tests.txt
done
for t in default sm_keep_e=1 sm_bulk_1024=1 sm_bulk_1024=1,sm_keep_e=1; do
  KF_TUNE=$([ $t = default ] || echo $t) PYTHONPATH=python timeout 100 python3 scripts/prof_softmax.py --shapes 4096x131072,4096x65536,2048x262144 --ops softmax 2>&1 | tee -a $O/sweep.txt
done
