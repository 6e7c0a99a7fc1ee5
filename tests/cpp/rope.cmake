# ctest groups of the rope family (included by tests/cpp/CMakeLists.txt).
add_test(NAME rope_plan COMMAND kf_tests --gtest_filter=*RopePlan*)
add_test(NAME rope_reference COMMAND kf_tests --gtest_filter=*RopeReference*)
add_test(NAME rope_validation COMMAND kf_tests --gtest_filter=*RopeValidation*)
# every RopeGpu case runs the default plan and then every candidate plan (flat and token kernels)
add_test(NAME rope_gpu COMMAND kf_tests --gtest_filter=*RopeGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(rope_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
