// Test entry point: says up front which GPU the kernel tests run on (or why they skip), and prints
// the plan of the last kernelforge launch (kernelforge::last_plan()) under every failed assertion,
// so that a failure names the kernel and launch parameters that produced it.
//
// --kf_no_gpu_exit_code=N: when no GPU is present and every selected test passed or skipped,
// exit with N instead of 0, so that ctest (SKIP_RETURN_CODE) shows the GPU group as skipped rather
// than passed. Failures keep their exit code; with KF_REQUIRE_GPU=1 a missing GPU is a failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernelforge/kernelforge.h"
#include "test_util.h"

namespace {
class PrintPlanOnFailure : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      const std::string plan = kernelforge::last_plan();
      std::printf("  last kernelforge plan: %s\n", plan.empty() ? "(none launched)" : plan.c_str());
    }
  }
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new PrintPlanOnFailure);
  int no_gpu_exit_code = 0;
  const char* flag = "--kf_no_gpu_exit_code=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) no_gpu_exit_code = std::atoi(argv[i] + std::strlen(flag));

  const int gpus = kftest::gpu_count();
  if (gpus > 0) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("kernelforge tests: GPU 0 is %s (sm_%d), %d device(s)\n", prop.name, kftest::gpu_capability(), gpus);
  } else {
    std::printf("kernelforge tests: no CUDA device; GPU tests %s\n",
                kftest::gpu_required() ? "FAIL (KF_REQUIRE_GPU=1)" : "are skipped");
  }
  const int rc = RUN_ALL_TESTS();
  if (rc == 0 && gpus == 0 && !kftest::gpu_required() && no_gpu_exit_code != 0) return no_gpu_exit_code;
  return rc;
}
