# ctest groups of the fused_linear_rowsum family (included by tests/cpp/CMakeLists.txt).
add_test(NAME fused_linear_rowsum_plan COMMAND kf_tests --gtest_filter=*FlrsPlan*)
add_test(NAME fused_linear_rowsum_reference COMMAND kf_tests --gtest_filter=*FlrsReference*)
add_test(NAME fused_linear_rowsum_validation COMMAND kf_tests --gtest_filter=*FlrsValidation*)
# FlrsGpu* includes FlrsGpuAllPlans: every candidate plan of each shape through launch_with_plan
add_test(NAME fused_linear_rowsum_gpu COMMAND kf_tests --gtest_filter=*FlrsGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(fused_linear_rowsum_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
