# ctest groups of programmatic dependent launch (included by tests/cpp/CMakeLists.txt): the switch, and
# the decode-step chain with the attribute on and off.
add_test(NAME pdl_switch COMMAND kf_tests --gtest_filter=PdlSwitch*)
add_test(NAME pdl_gpu COMMAND kf_tests --gtest_filter=*PdlChainGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(pdl_gpu PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
