# ctest groups of the decode family (included by tests/cpp/CMakeLists.txt).
add_test(NAME decode_plan COMMAND kf_tests --gtest_filter=DecodePlan*:DecodeValidation*:DecodeReference*)
add_test(NAME decode_gpu COMMAND kf_tests --gtest_filter=*DecodeGpu*-*MlaDecodeGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(decode_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
add_test(NAME mla_decode_plan COMMAND kf_tests --gtest_filter=MlaDecodePlan*:MlaDecodeValidation*:MlaDecodeReference*)
add_test(NAME mla_decode_gpu COMMAND kf_tests --gtest_filter=*MlaDecodeGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(mla_decode_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
