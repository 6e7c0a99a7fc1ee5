# ctest groups of the cross_entropy family (included by tests/cpp/CMakeLists.txt).
add_test(NAME ce_plan COMMAND kf_tests --gtest_filter=*CePlan*)
add_test(NAME ce_reference COMMAND kf_tests --gtest_filter=*CeReference*)
add_test(NAME ce_validation COMMAND kf_tests --gtest_filter=*CeValidation*)
# every CeGpu case runs the default plan and then every candidate plan through launch_with_plan
add_test(NAME ce_gpu COMMAND kf_tests --gtest_filter=*CeGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(ce_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
# the fused linear cross-entropy (the chunk loop over the GEMM family and these kernels)
add_test(NAME flce_host COMMAND kf_tests --gtest_filter=FlceValidation*:FlceReference*)
add_test(NAME flce_gpu COMMAND kf_tests --gtest_filter=*FlceGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(flce_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
