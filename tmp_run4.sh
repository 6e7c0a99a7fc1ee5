#!/usr/bin/env bash
O=$OUT/r4
mkdir -p $O
export KF_COMMIT=$(cat .commit)
KF_CTEST_ARGS="-R 'rope_gpu|activation_gpu'" bash scripts/gpu_run.sh $O build ctest > /dev/null 2>&1; tail -4 $O/log.txt
for t in default act_one_vec=1; do
  KF_TUNE=$([ $t = default ] || echo $t) PYTHONPATH=python python3 scripts/prof_act.py 2>&1 | tee -a $O/act_sweep.txt
done
pip install -q --no-deps --target /tmp/site .whl/liger*.whl >/dev/null 2>&1
for t in rope_flat_max=0 rope_flat_max=0,rope_cs_late=0; do
  KF_TUNE=$t PYTHONPATH=python:/tmp/site python3 scripts/prof_rope.py --tokens 64,256,512,1024,2048,4096 2>&1 | tee -a $O/rope_sweep.txt
done
for t in default rope_cs_late=0; do
  KF_TUNE=$([ $t = default ] || echo $t) KF_BENCH_ARGS="apply_rope --shapes b4s4096h32/8d128 --providers kernelforge,liger" bash scripts/gpu_run.sh $O/b_$t bench > /dev/null 2>&1
  grep "apply_rope  " $O/b_$t/log.txt | grep -v "^\[" | sed "s/^/$t /" | tee -a $O/rope_sweep.txt
done
