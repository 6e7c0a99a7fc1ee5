# ctest groups of the norm family (included by tests/cpp/CMakeLists.txt).
add_test(NAME norm_reference COMMAND kf_tests --gtest_filter=*NormReference*:TestUtil*)
add_test(NAME norm_validation COMMAND kf_tests --gtest_filter=*NormValidation*)
# the planner on H100 / A100 / T4 device facts, no GPU
add_test(NAME norm_plan COMMAND kf_tests --gtest_filter=NormPlan.*)
# Without a GPU every kernel test skips itself and the binary exits with 77: ctest shows the group
# as skipped rather than passed. With KF_REQUIRE_GPU=1 the missing GPU is a failure instead.
# the NormGpu fixtures in three entries, so that `ctest -j` runs them side by side (their float64 host
# references take most of the time)
add_test(NAME norm_gpu COMMAND kf_tests --gtest_filter=*NormGpu.* --kf_no_gpu_exit_code=77)
set_tests_properties(norm_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
add_test(NAME norm_gpu_more COMMAND kf_tests --gtest_filter=*NormGpuAda.*:*NormGpuDeterminism.*:*NormGpuMisc.*
                                     --kf_no_gpu_exit_code=77)
set_tests_properties(norm_gpu_more PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
# every candidate plan of each shape through launch_with_plan (test_norm_plans.cpp)
add_test(NAME norm_gpu_plans COMMAND kf_tests --gtest_filter=*NormGpuPlans.* --kf_no_gpu_exit_code=77)
set_tests_properties(norm_gpu_plans PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
