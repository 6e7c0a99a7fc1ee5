#!/usr/bin/env bash
O=$OUT/r3
mkdir -p $O
export KF_COMMIT=$(cat .commit)
bash scripts/gpu_run.sh $O build > /dev/null 2>&1; tail -3 $O/log.txt
for t in default bulk=0; do
  KF_TUNE=$([ $t = default ] || echo $t) KF_PYDIR=python timeout 100 python3 scripts/prof_norm.py --fwd-only --shapes 4096x65536,2048x131072 --ops rms_norm,layer_norm,add_rms_norm 2>&1 | tee -a $O/norm_sweep.txt
done
