# ctest groups of the GEMM family (included by tests/cpp/CMakeLists.txt).
add_test(NAME gemm_plan COMMAND kf_tests --gtest_filter=GemmValidation*:GemmReference*)
add_test(NAME gemm_gpu COMMAND kf_tests --gtest_filter=*GemmGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(gemm_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
