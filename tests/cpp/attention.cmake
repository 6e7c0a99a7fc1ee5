# ctest groups of the attention family (included by tests/cpp/CMakeLists.txt).
add_test(NAME attention_plan COMMAND kf_tests --gtest_filter=*AttentionPlan*)
add_test(NAME attention_reference COMMAND kf_tests --gtest_filter=*AttentionReference*)
add_test(NAME attention_validation COMMAND kf_tests --gtest_filter=*AttentionValidation*)
# every AttentionGpu case runs the public entry (the default plan) and then every candidate plan
add_test(NAME attention_gpu COMMAND kf_tests --gtest_filter=*AttentionGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(attention_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
# the backward: the float64 reference against finite differences, validation, and the GPU kernels
# against the reference (every candidate plan of every case)
add_test(NAME attention_bwd_reference COMMAND kf_tests --gtest_filter=*AttentionBwdReference*)
add_test(NAME attention_bwd_validation COMMAND kf_tests --gtest_filter=*AttentionBwdValidation*)
add_test(NAME attention_bwd_gpu COMMAND kf_tests --gtest_filter=*AttentionBwdGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(attention_bwd_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
add_test(NAME attention_bwd_plan COMMAND kf_tests --gtest_filter=*AttentionBwdPlan*)
