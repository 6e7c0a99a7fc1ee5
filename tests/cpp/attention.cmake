# ctest groups of the attention family (included by tests/cpp/CMakeLists.txt).
add_test(NAME attention_plan COMMAND kf_tests --gtest_filter=*AttentionPlan*)
