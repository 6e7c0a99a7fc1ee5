# ctest groups of the softmax family (included by tests/cpp/CMakeLists.txt).
add_test(NAME softmax_reference COMMAND kf_tests --gtest_filter=*SoftmaxReference*)
add_test(NAME softmax_validation COMMAND kf_tests --gtest_filter=*SoftmaxValidation*)
add_test(NAME softmax_gpu COMMAND kf_tests --gtest_filter=*SoftmaxGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(softmax_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
# The same tests with the bulk-copy kernel (sm_90) taking every call it can: any row length, any row
# count, the backward too (by default only long forward rows with more rows than SMs take it).
add_test(NAME softmax_gpu_bulk COMMAND kf_tests --gtest_filter=*SoftmaxGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(softmax_gpu_bulk PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77 ENVIRONMENT
                     "KF_TUNE=sm_bulk_min_row=0,sm_bulk_min_rows=0,sm_bulk_bwd=1")
