// grouped_mm without a GPU: the float64 reference on hand-computed cases (the group rule included),
// the argument checks (every message names the argument), and the planner's choices.
#include <vector>

#include "grouped_mm/grouped_mm_problem.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
constexpr DType F64 = DType::kFloat64, BF16 = DType::kBFloat16, I32 = DType::kInt32;

HostTensor filled(DType t, std::vector<int64_t> shape, std::vector<double> v) {
  HostTensor h(t, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) h.set(int64_t(i), v[i]);
  return h;
}

// x [4, 2] = rows (1, 2), (3, 4), (5, 6), (7, 8); w [2, 1, 2] = (1, 1) and (1, -1).
TEST(GmmReference, RowsFollowTheGroupRule) {
  const HostTensor x = filled(F64, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const HostTensor w = filled(F64, {2, 1, 2}, {1, 1, 1, -1});
  struct Case {
    std::vector<double> offsets;
    std::vector<double> want;
  };
  const Case cases[] = {
      {{1, 4}, {3, -1, -1, -1}},    // group 0: row 0; group 1: rows 1-3
      {{0, 4}, {-1, -1, -1, -1}},   // empty first group
      {{4, 4}, {3, 7, 11, 15}},     // empty last group
      {{2, 3}, {3, 7, -1, 0}},      // row 3 belongs to no group: 0
      {{3, 1}, {3, 7, 11, 0}},      // decreasing: group 1 = [3, max(3, 1)) is empty
      {{-5, 9}, {-1, -1, -1, -1}},  // clamped to [0, T]
  };
  for (const Case& c : cases) {
    const HostTensor off = filled(I32, {2}, c.offsets);
    HostTensor out(F64, {4, 1});
    KF_ASSERT_OK(ref::grouped_mm(x.view(), w.view(), off.view(), out.view()));
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(out.get(i), c.want[size_t(i)]) << "offsets " << c.offsets[0] << "," << c.offsets[1] << " row " << i;
  }
}

TEST(GmmReference, ColumnMajorWeightsAndWeightGradient) {
  // w given as the transposed view of wt [E, K, N]: w[e, n, k] = wt[e, k, n].
  const HostTensor x = filled(F64, {3, 2}, {1, 2, 3, 4, 5, 6});
  const HostTensor wt = filled(F64, {2, 2, 2}, {1, 0, 0, 1, 2, 1, 0, 3});  // e0 = I, e1 = [[2, 1], [0, 3]]
  TensorView wv = wt.view();
  std::swap(wv.shape[1], wv.shape[2]);
  std::swap(wv.strides[1], wv.strides[2]);
  const HostTensor off = filled(I32, {2}, {1, 3});
  HostTensor out(F64, {3, 2});
  KF_ASSERT_OK(ref::grouped_mm(x.view(), wv, off.view(), out.view()));
  // row 0 (e0): (1, 2); rows 1, 2 (e1): out[n] = sum_k x[k] wt[k, n]: (3*2, 3*1 + 4*3) = (6, 15); (10, 23)
  const double want[] = {1, 2, 6, 15, 10, 23};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out.get(i), want[i]) << i;
  // dw[e] = dy_e^T x_e with dy = out: e0 = (1, 2)^T (1, 2); e1 = sum over rows 1, 2.
  HostTensor dw(F64, {3, 2, 2});  // three groups: the last is empty and gets 0
  const HostTensor off3 = filled(I32, {3}, {1, 3, 3});
  KF_ASSERT_OK(ref::grouped_mm_wgrad(out.view(), x.view(), off3.view(), dw.view()));
  const double want_dw[] = {1, 2, 2, 4, 6 * 3 + 10 * 5, 6 * 4 + 10 * 6, 15 * 3 + 23 * 5, 15 * 4 + 23 * 6, 0, 0, 0, 0};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(dw.get(i), want_dw[i]) << i;
}

TEST(GmmValidation, MessagesNameTheArgument) {
  const HostTensor x(BF16, {8, 16}), w(BF16, {2, 4, 16}), off = filled(I32, {2}, {3, 8}), out(BF16, {8, 4});
  KF_ASSERT_OK(ref::grouped_mm(x.view(), w.view(), off.view(), out.view()));
  const HostTensor w_k(BF16, {2, 4, 15});
  KF_EXPECT_INVALID(ref::grouped_mm(x.view(), w_k.view(), off.view(), out.view()), "w must have shape [E, N, K]",
                    "K = 16");
  const HostTensor w_e(BF16, {3, 4, 16});
  KF_EXPECT_INVALID(ref::grouped_mm(x.view(), w_e.view(), off.view(), out.view()), "E = 2");
  const HostTensor out_n(BF16, {8, 5});
  KF_EXPECT_INVALID(ref::grouped_mm(x.view(), w.view(), off.view(), out_n.view()),
                    "out must have shape [T, N] = [8, 4]");
  const HostTensor off64(DType::kInt64, {2});
  KF_EXPECT_INVALID(ref::grouped_mm(x.view(), w.view(), off64.view(), out.view()), "offsets must be int32");
  const HostTensor off0(I32, {0});
  KF_EXPECT_INVALID(ref::grouped_mm(x.view(), w.view(), off0.view(), out.view()), "offsets must have shape [E]");
  const HostTensor x16(DType::kFloat16, {8, 16});
  KF_EXPECT_INVALID(ref::grouped_mm(x16.view(), w.view(), off.view(), out.view()), "w must have x's dtype float16");
  TensorView xt = x.view();  // a column-major x
  xt.strides[0] = 1, xt.strides[1] = 8;
  KF_EXPECT_INVALID(ref::grouped_mm(xt, w.view(), off.view(), out.view()), "x must be row-major");
  TensorView wbad = w.view();  // neither dimension of the matrices contiguous
  wbad.strides[1] = 32, wbad.strides[2] = 2;
  KF_EXPECT_INVALID(ref::grouped_mm(x.view(), wbad, off.view(), out.view()), "w's matrices must have stride 1");
  const HostTensor dy(BF16, {8, 4}), dw(BF16, {2, 4, 16}), dw_bad(BF16, {2, 16, 4}), x_t(BF16, {7, 16});
  KF_ASSERT_OK(ref::grouped_mm_wgrad(dy.view(), x.view(), off.view(), dw.view()));
  KF_EXPECT_INVALID(ref::grouped_mm_wgrad(dy.view(), x.view(), off.view(), dw_bad.view()),
                    "dw must have shape [E, N, K] = [2, 4, 16]");
  KF_EXPECT_INVALID(ref::grouped_mm_wgrad(dy.view(), x_t.view(), off.view(), dw.view()),
                    "x must have shape [T, K] with T = 8");
  TensorView xcuda = x.view();
  xcuda.device = {DeviceType::kCUDA, 0};
  KF_EXPECT_INVALID(ref::grouped_mm(xcuda, w.view(), off.view(), out.view()), "every tensor must be on the CPU");
}

kf::GmmProblem problem(kf::GroupedMmOp op, int64_t t, int64_t n, int64_t k, bool aligned) {
  kf::GmmProblem p;
  p.op = op, p.groups = 8, p.t = t, p.n = n, p.k = k, p.elem_bytes = 2, p.tma_aligned = aligned;
  return p;
}

TEST(GmmPlan, WgmmaOnSm90WhenAlignedAndBuilt) {
  kf::DeviceInfo h100{132, 90, 2048, 50 << 20}, a100{108, 80, 2048, 40 << 20};
  const auto fwd = problem(kf::GroupedMmOp::kRowsWRow, 4096, 1024, 512, true);
  EXPECT_EQ(kf::plan_grouped_mm(fwd, h100, true).kernel, kf::GroupedMmKernel::kWgmma);
  EXPECT_EQ(kf::plan_grouped_mm(fwd, h100, true).grid, 132);
  EXPECT_EQ(kf::plan_grouped_mm(fwd, h100, false).kernel, kf::GroupedMmKernel::kMma);
  EXPECT_EQ(kf::plan_grouped_mm(fwd, a100, true).kernel, kf::GroupedMmKernel::kMma);
  EXPECT_EQ(kf::plan_grouped_mm(problem(kf::GroupedMmOp::kRowsWCol, 4096, 1000, 512, false), h100, true).kernel,
            kf::GroupedMmKernel::kMma);
  // K = 0 (out = 0) and a wgrad without rows (dw = 0) go to the mma kernel, which writes the zeros.
  EXPECT_EQ(kf::plan_grouped_mm(problem(kf::GroupedMmOp::kRowsWRow, 64, 64, 0, true), h100, true).kernel,
            kf::GroupedMmKernel::kMma);
  const auto empty_wgrad = kf::plan_grouped_mm(problem(kf::GroupedMmOp::kWgrad, 0, 64, 64, true), h100, true);
  EXPECT_EQ(empty_wgrad.kernel, kf::GroupedMmKernel::kMma);
  EXPECT_EQ(empty_wgrad.grid, 8);  // 8 groups x one 64 x 64 tile
  // Nothing to write: no launch.
  EXPECT_EQ(kf::plan_grouped_mm(problem(kf::GroupedMmOp::kRowsWRow, 0, 64, 64, true), h100, true).grid, 0);
  // mma grid: (ceil(T / 64) + E) row tiles x ceil(N / 64) column tiles.
  EXPECT_EQ(kf::plan_grouped_mm(fwd, a100, true).grid, (64 + 8) * 16);
  EXPECT_EQ(kf::to_string(kf::plan_grouped_mm(fwd, h100, true)),
            "grouped_mm_wgmma rows/w-row tile=128x256x64 cluster=2 grid=132");
  EXPECT_EQ(kf::candidate_plans(fwd, h100, true).size(), 2u);
}

}  // namespace
