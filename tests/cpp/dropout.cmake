# ctest groups of the dropout family (included by tests/cpp/CMakeLists.txt).
add_test(NAME dropout_plan COMMAND kf_tests --gtest_filter=*DropPlan*)
add_test(NAME dropout_reference COMMAND kf_tests --gtest_filter=*DropReference*)
add_test(NAME dropout_validation COMMAND kf_tests --gtest_filter=*DropValidation*)
# DropGpu* includes DropGpuAllPlans: every candidate plan of each shape through launch_with_plan
add_test(NAME dropout_gpu COMMAND kf_tests --gtest_filter=*DropGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(dropout_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
