#!/usr/bin/env bash
O=$OUT/r1
mkdir -p $O
export KF_COMMIT=$(cat .commit)
KF_CTEST_ARGS="-R 'rope'" KF_SANITIZER_FILTER='*RopeGpu*' KF_BENCH_ARGS="apply_rope --shapes b1s1h32/8d128,b64s1h32/8d128" bash scripts/gpu_run.sh $O build ctest sanitizer bench
pip install -q --no-deps --target /tmp/site .whl/liger*.whl >/dev/null 2>&1
for t in default rope_flat_max=100000; do
  KF_TUNE=$([ $t = default ] || echo $t) PYTHONPATH=python:/tmp/site python3 scripts/prof_rope.py --tokens 1,8,64,128,256,512,1024,4096 $([ $t = default ] && echo --liger) 2>&1 | tee -a $O/rope_sweep.txt
done
