# ctest groups of the rope family (included by tests/cpp/CMakeLists.txt).
add_test(NAME rope_reference COMMAND kf_tests --gtest_filter=*RopeReference*)
add_test(NAME rope_validation COMMAND kf_tests --gtest_filter=*RopeValidation*)
add_test(NAME rope_gpu COMMAND kf_tests --gtest_filter=*RopeGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(rope_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
# every RopeGpu case through the token kernel (the test shapes are decode-sized: the flat kernel by default)
add_test(NAME rope_gpu_token COMMAND kf_tests --gtest_filter=*RopeGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(rope_gpu_token PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77 ENVIRONMENT "KF_TUNE=rope_flat_max=0")
