# ctest groups of the grouped_mm family (included by tests/cpp/CMakeLists.txt).
add_test(NAME grouped_mm_host COMMAND kf_tests --gtest_filter=GmmReference*:GmmValidation*:GmmPlan*)
# GmmGpu* runs every candidate plan (wgmma and mma on sm_90) of every case.
add_test(NAME grouped_mm_gpu COMMAND kf_tests --gtest_filter=*GmmGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(grouped_mm_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
