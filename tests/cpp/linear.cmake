# ctest groups of the linear family (included by tests/cpp/CMakeLists.txt).
add_test(NAME linear_plan COMMAND kf_tests --gtest_filter=LinearPlan*:LinearValidation*:LinearReference*)
add_test(NAME linear_gpu COMMAND kf_tests --gtest_filter=*LinearGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(linear_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
