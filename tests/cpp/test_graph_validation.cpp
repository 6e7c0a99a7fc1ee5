// Argument checks of the graph family (no GPU needed: validation runs before any device access).
// Every message names the op, the argument and the expectation.
#include "kernelforge/graph.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using kf::GraphReduce;

struct Views {
  kf::TensorView x = cuda_view(DType::kBFloat16, {10, 8}, 0, uintptr_t{1} << 40);
  kf::TensorView rowptr = cuda_view(DType::kInt64, {4}, 0, uintptr_t{2} << 40);
  kf::TensorView out = cuda_view(DType::kBFloat16, {3, 8}, 0, uintptr_t{3} << 40);
  kf::TensorView arg = cuda_view(DType::kInt32, {3, 8}, 0, uintptr_t{4} << 40);
  kf::TensorView col = cuda_view(DType::kInt64, {12}, 0, uintptr_t{5} << 40);
  kf::TensorView w = cuda_view(DType::kBFloat16, {12}, 0, uintptr_t{6} << 40);
  kf::GatherReduceArgs args(GraphReduce r = GraphReduce::kSum) {
    kf::GatherReduceArgs a;
    a.name = "segment_sum";
    a.x = &x, a.rowptr = &rowptr, a.out = &out, a.reduce = r;
    if (r == GraphReduce::kMax) a.argmax = &arg;
    return a;
  }
};

kf::Status run(const kf::GatherReduceArgs& a) { return kf::gather_reduce(a, nullptr, 0, nullptr); }

TEST(GraphValidation, GatherReduce) {
  Views v;
  kf::TensorView bad = v.x;
  bad.dtype = DType::kInt32;
  kf::GatherReduceArgs a = v.args();
  a.x = &bad;
  KF_EXPECT_INVALID(run(a), "segment_sum", "x must be a float32/float16/bfloat16 tensor, got int32");
  kf::TensorView cpu = v.x;
  cpu.device = {DeviceType::kCPU, 0};
  a.x = &cpu;
  KF_EXPECT_INVALID(run(a), "x must be a CUDA tensor, got cpu");
  kf::TensorView out = cuda_view(DType::kBFloat16, {4, 8});
  a = v.args();
  a.out = &out;
  KF_EXPECT_INVALID(run(a), "out must have shape [3, 8], got [4, 8]");
  kf::TensorView out16 = cuda_view(DType::kFloat16, {3, 8});
  a.out = &out16;
  KF_EXPECT_INVALID(run(a), "out must have the same dtype as x (bfloat16), got float16");
  kf::TensorView rp = cuda_view(DType::kFloat32, {4});
  a = v.args();
  a.rowptr = &rp;
  KF_EXPECT_INVALID(run(a), "rowptr must be an int32 or int64 tensor, got float32");
  kf::TensorView rp0 = cuda_view(DType::kInt64, {0});
  a.rowptr = &rp0;
  KF_EXPECT_INVALID(run(a), "rowptr must have N + 1 >= 1 elements");
  kf::TensorView col32 = cuda_view(DType::kInt32, {12});
  a = v.args();
  a.col = &col32;
  KF_EXPECT_INVALID(run(a), "col must have the same dtype as rowptr (int64), got int32");
  kf::TensorView strided = v.col;
  strided.strides[0] = 2;
  a.col = &strided;
  KF_EXPECT_INVALID(run(a), "col must be contiguous, got stride 2");
  kf::TensorView w11 = cuda_view(DType::kBFloat16, {11});
  a.col = &v.col;
  a.weight = &w11;
  KF_EXPECT_INVALID(run(a), "edge_weight must have shape [12] (one per edge), got [11]");
  kf::TensorView x3 = cuda_view(DType::kBFloat16, {10, 8, 1});
  a = v.args();
  a.x = &x3;
  KF_EXPECT_INVALID(run(a), "x must have 2 dimensions [rows, features]");
  kf::TensorView xs = v.x;
  xs.strides[1] = 2;
  a.x = &xs;
  KF_EXPECT_INVALID(run(a), "x must be contiguous in its last dimension");
}

TEST(GraphValidation, Argmax) {
  Views v;
  kf::GatherReduceArgs a = v.args(GraphReduce::kMax);
  a.argmax = nullptr;
  KF_EXPECT_INVALID(run(a), "argmax must be given with reduce max (int32 [3, 8])");
  a = v.args(GraphReduce::kSum);
  a.argmax = &v.arg;
  KF_EXPECT_INVALID(run(a), "argmax is only taken with reduce max");
  kf::TensorView a64 = cuda_view(DType::kInt64, {3, 8});
  a = v.args(GraphReduce::kMax);
  a.argmax = &a64;
  KF_EXPECT_INVALID(run(a), "argmax must be an int32 tensor, got int64");
  a.reduce = static_cast<GraphReduce>(7);
  KF_EXPECT_INVALID(run(a), "reduce must be GraphReduce::kSum, kMean or kMax, got 7");
}

TEST(GraphValidation, BackwardEntries) {
  kf::TensorView dout = cuda_view(DType::kFloat32, {3, 4}), rp = cuda_view(DType::kInt32, {4});
  kf::TensorView dx = cuda_view(DType::kFloat32, {9, 5}), rp5 = cuda_view(DType::kInt32, {5});
  KF_EXPECT_INVALID(
      kf::segment_reduce_backward("segment_mean_backward", dout, rp, GraphReduce::kMean, nullptr, dx, nullptr),
      "segment_mean_backward", "dx must have shape [*, 4], got [9, 5]");
  kf::TensorView dx4 = cuda_view(DType::kFloat32, {9, 4});
  KF_EXPECT_INVALID(
      kf::segment_reduce_backward("segment_sum_backward", dout, rp5, GraphReduce::kSum, nullptr, dx4, nullptr),
      "rowptr must have 4 elements (rows of dout + 1), got [5]");
  kf::TensorView x = cuda_view(DType::kFloat32, {6, 4}), src = cuda_view(DType::kInt32, {7});
  kf::TensorView dst = cuda_view(DType::kInt32, {8}), dw = cuda_view(DType::kFloat32, {7});
  KF_EXPECT_INVALID(
      kf::edge_weight_grad("gather_scatter_backward", dout, x, src, dst, rp, GraphReduce::kSum, nullptr, dw, nullptr),
      "dst must have 7 elements (one per edge, as src), got [8]");
  kf::TensorView dst7 = cuda_view(DType::kInt32, {7}), dw6 = cuda_view(DType::kFloat32, {6});
  KF_EXPECT_INVALID(
      kf::edge_weight_grad("gather_scatter_backward", dout, x, src, dst7, rp, GraphReduce::kSum, nullptr, dw6, nullptr),
      "dw must have shape [7] (one per edge), got [6]");
}

}  // namespace
