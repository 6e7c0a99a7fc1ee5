# ctest groups of the diagonal_matmul family (included by tests/cpp/CMakeLists.txt).
add_test(NAME diagonal_matmul_host COMMAND kf_tests --gtest_filter=DmReference*:DmValidation*:DmPlan*)
# DmGpu* includes DmGpuAllPlans (every candidate plan of each shape) and DmGpuLarge (past 2^31 elements)
add_test(NAME diagonal_matmul_gpu COMMAND kf_tests --gtest_filter=*DmGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(diagonal_matmul_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
