#!/usr/bin/env bash
O=$OUT/full
mkdir -p $O
export KF_COMMIT=$(cat .commit)
python3 -c "import xdist; print('xdist', xdist.__version__)" 2>&1 | tail -1
bash scripts/gpu_run.sh $O 2>&1 | tail -12
