set -o pipefail; export PYTHONUNBUFFERED=1 PYTHONPATH=python
KF_CUDA_ARCHS=90a-real KF_JOBS=16 KF_CMAKE_ARGS="-DKF_BUILD_TESTS=OFF" KF_BUILD_DIR=_build/gpu scripts/dev_build.sh 2>&1 | tail -1
timeout 200 python3 scripts/gpu_smoke.py --check-only 2>&1 | grep -v "^ok "
S="timeout 100 python3 scripts/gpu_smoke.py --time-only --kf-only"
$S --shapes 16384x2048,16384x4096,16384x8192,4096x65536,2048x131072
KF_TUNE=bulk=0 $S --shapes 16384x4096 | grep -v copy | sed "s/^/bulk=0 /"
for t in "bulk_vpt=1" "bulk_vpt=4" "bulk_smem=32768" "bulk_smem=131072,bwd_bulk_smem=131072" "bulk_slice=16384" "bwd_bulk_smem=49152"; do KF_TUNE=$t $S --shapes 16384x2048,16384x4096,16384x8192,4096x65536,2048x131072 | grep -v copy | sed "s/^/$t /"; done
