# ctest groups of the graph family (included by tests/cpp/CMakeLists.txt).
add_test(NAME graph_plan COMMAND kf_tests --gtest_filter=*GraphPlan*)
add_test(NAME graph_reference COMMAND kf_tests --gtest_filter=*GraphReference*)
add_test(NAME graph_validation COMMAND kf_tests --gtest_filter=*GraphValidation*)
# GraphGpu runs every candidate plan of each case through launch_with_plan
add_test(NAME graph_gpu COMMAND kf_tests --gtest_filter=*GraphGpu* --kf_no_gpu_exit_code=77)
set_tests_properties(graph_gpu PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
