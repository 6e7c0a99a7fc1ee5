#!/usr/bin/env bash
# build, attention C++ tests (fwd + bwd), attention pytest, a bench of fwd softcap and fwdbwd
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
KF_CMAKE_ARGS="-DKF_GTEST_SOURCE_DIR=$PWD/.gtest" KF_CUDA_ARCHS=90a-real bash scripts/dev_build.sh > $OUT/build.log 2>&1 || { grep -B2 -A12 "error" $OUT/build.log | head -60; exit 1; }
echo "build $SECONDS s"
bin=_build/dev/tests/cpp/kf_tests
KF_REQUIRE_GPU=1 timeout 200 $bin --gtest_filter='*AttentionBwd*' > $OUT/bwd.log 2>&1; echo "bwd gtest rc $? $SECONDS s"
grep -E "^\[  FAILED|tests ran|PASSED" $OUT/bwd.log | head -30
grep -B3 -A12 "Failure" $OUT/bwd.log | head -80
KF_REQUIRE_GPU=1 timeout 150 $bin --gtest_filter='*AttentionGpu*:*Softmax*Gpu*:*Norm*Gpu*' > $OUT/fwd.log 2>&1; echo "fwd+softmax+norm gtest rc $? $SECONDS s"
grep -E "^\[  FAILED|tests ran|PASSED" $OUT/fwd.log | head -20
