// prefetch_l2: a hint with no output, so what can be checked is that it writes nothing, reads nothing
// out of range and reports bad arguments. Ranges of every size class (under one 16-byte word, one
// per-thread chunk of 16 KB and its neighbours, many chunks) at unaligned starts inside a buffer whose
// bytes are poisoned (0xFF: NaN in every float dtype) and random elsewhere: after the calls, in a stream
// and replayed from a CUDA graph, every byte is unchanged. compute-sanitizer memcheck runs these
// (the sm_90 bulk prefetch of a range's interior and the line prefetches at its ends stay inside it).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernelforge/decode.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;

TEST(DecodeValidationPrefetchL2, Arguments) {
  // checked before any CUDA call, so they hold without a GPU
  kf::Status s = kf::prefetch_l2(nullptr, -1, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bytes must be >= 0, got -1"), std::string::npos) << s.message();
  s = kf::prefetch_l2(nullptr, 64, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ptr is null with bytes = 64"), std::string::npos) << s.message();
  EXPECT_TRUE(kf::prefetch_l2(nullptr, 0, nullptr).ok());  // an empty range launches nothing
}

TEST(DecodeGpuPrefetchL2, HostMemoryRefused) {
  KF_NEED_GPU();
  std::vector<char> host(4096);
  const kf::Status s = kf::prefetch_l2(host.data(), 4096, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("must point to device or managed memory"), std::string::npos) << s.message();
  void* pinned = nullptr;
  KF_CUDA_CHECK(cudaMallocHost(&pinned, 4096));
  const kf::Status p = kf::prefetch_l2(pinned, 4096, nullptr);
  cudaFreeHost(pinned);
  EXPECT_FALSE(p.ok());
  EXPECT_NE(p.message().find("page-locked host memory"), std::string::npos) << p.message();
}

TEST(DecodeGpuPrefetchL2, WritesNothing) {
  KF_NEED_GPU();
  const int64_t size = 3 * (int64_t(1) << 20) + 37;
  std::vector<unsigned char> host(size_t(size), 0xFF);
  std::mt19937 rng(7);
  for (int64_t i = 4096; i < size; ++i) host[size_t(i)] = static_cast<unsigned char>(rng() & 0xFF);
  unsigned char* dev = nullptr;
  KF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), size_t(size)));
  KF_CUDA_CHECK(cudaMemcpy(dev, host.data(), size_t(size), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  KF_CUDA_CHECK(cudaStreamCreate(&stream));
  struct Range {
    int64_t offset, bytes;
  };
  const Range ranges[] = {
      {0, 1},    {7, 9},          {3, 16},  {1, 16383}, {5, 16384}, {16380, 16389}, {11, (1 << 20) + 3},
      {0, size}, {size - 17, 17}, {size, 0}};
  for (const Range& r : ranges) KF_ASSERT_OK(kf::prefetch_l2(dev + r.offset, r.bytes, stream));
  // the same calls captured once and replayed
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  KF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (const Range& r : ranges) KF_ASSERT_OK(kf::prefetch_l2(dev + r.offset, r.bytes, stream));
  KF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  KF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) KF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  KF_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<unsigned char> back(host.size());
  KF_CUDA_CHECK(cudaMemcpy(back.data(), dev, size_t(size), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(back == host) << "prefetch_l2 changed the bytes it was asked to prefetch";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(dev);
}

}  // namespace
