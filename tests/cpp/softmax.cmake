# ctest groups of the softmax family (included by tests/cpp/CMakeLists.txt).
add_test(NAME softmax_reference COMMAND kf_tests --gtest_filter=*SoftmaxReference*)
add_test(NAME softmax_validation COMMAND kf_tests --gtest_filter=*SoftmaxValidation*)
# the planner on H100 / A100 / T4 device facts: no GPU needed
add_test(NAME softmax_plan COMMAND kf_tests --gtest_filter=SoftmaxPlan.*)
# the kernels against the float64 reference: the default plan of every case, then every candidate
# plan of each shape through launch_with_plan (SoftmaxGpuPlans)
add_test(NAME softmax_gpu COMMAND kf_tests --gtest_filter=*SoftmaxGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(softmax_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
