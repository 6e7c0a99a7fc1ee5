# ctest groups of the activation family (included by tests/cpp/CMakeLists.txt).
add_test(NAME activation_plan COMMAND kf_tests --gtest_filter=*ActPlan*)
add_test(NAME activation_reference COMMAND kf_tests --gtest_filter=*ActReference*)
add_test(NAME activation_validation COMMAND kf_tests --gtest_filter=*ActValidation*)
# ActGpu* includes ActGpuAllPlans: every candidate plan of each shape through launch_with_plan
add_test(NAME activation_gpu COMMAND kf_tests --gtest_filter=*ActGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(activation_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
