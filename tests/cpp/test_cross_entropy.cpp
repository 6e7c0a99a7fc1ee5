// The CUDA cross-entropy kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case runs the forward, then the backward twice (out of place, and in place: dlogits ==
// logits), on fresh random logits (normal, sigma 3, or 20 with the softcap, so the softmax is far
// from flat; never zeros) with targets that include the last class, class 0 and ignore_index rows.
// Every output is poisoned with NaN (0xFF bytes) before the run and every element is compared with
// the one tolerance table per dtype (test_cross_entropy_util.h); NaN never passes (an expected NaN is checked against a
// finite sentinel written before the run, so a missing write cannot pass either). Inputs must come
// back unchanged (the logits too, except after the in-place backward), and bytes outside each view
// (row padding, base offset, strided-vector gaps, a guard after the last row) must stay untouched.
//
// Shapes (T x V): one class, odd and prime vocabularies (a scalar head, then 16-byte vectors and a
// partial last one, where logits and dlogits share their misalignment; one element per access else),
// the forward's segment boundary (16384 bf16/fp16 or 8192 fp32 logits per CTA: 3 x 16383, 3 x 16385),
// the common LLM vocabularies (32000, 128256, 262144), no rows, and many rows (two finalize blocks);
// layouts contiguous, row-padded, odd row stride, unaligned base pointer (one element past 16 B),
// and mixed (aligned logits, unaligned gradient). Options: label smoothing, z-loss, softcap, int32
// targets, an ignore_index inside the vocabulary, each reduction (mean / sum / none, with a strided
// dloss for none), vocabulary-parallel shards (class_start / num_classes: the first, a middle and
// the last shard, targets inside and outside). Each case runs the public entries (the default plan) and then every
// candidate plan of the planner (16-byte vectors, scalar head + vectors, one element: whichever the layout allows)
// through launch_with_plan. Special cases (out-of-range targets, every row ignored, determinism,
// many rows) are in test_cross_entropy_special.cpp. Tests skip without a GPU, and fail instead when
// KF_REQUIRE_GPU=1.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cross_entropy/cross_entropy_plan.h"
#include "test_cross_entropy_util.h"

namespace {

class CeGpu : public CeGpuBase, public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    if (dtype() == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t T() const { return std::get<1>(GetParam()).rows; }
  int64_t V() const { return std::get<1>(GetParam()).vocab; }
  LayoutKind layout() const { return std::get<2>(GetParam()); }
  const Opt& opt() const { return std::get<3>(GetParam()); }
};

TEST_P(CeGpu, ForwardBackward) {
  const DType dt = dtype();
  const int64_t T = this->T(), V = this->V();
  const LayoutKind lk = layout();
  const Opt& op = opt();
  const CrossEntropyOptions o = op.opts(V);
  const CeTol tol = ce_tolerance(dt);
  Rng rng(seed("fwd+bwd"));
  const HostTensor x = random_logits(dt, T, V, op.sigma, rng);
  const HostTensor tgt = op.shard()
                             ? make_targets(op.target, T, o.num_classes, op.ignore, rng, op.before, op.before + V)
                             : make_targets(op.target, T, V, op.ignore, rng);

  // reference forward
  HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
  KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));
  std::vector<double> lse_scale(static_cast<size_t>(T)), rl_scale(static_cast<size_t>(T));
  double loss_scale = 0;
  for (int64_t i = 0; i < T; ++i) {
    lse_scale[i] = 1 + std::fabs(lse.get(i));
    rl_scale[i] = 1 + std::fabs(lse.get(i)) + std::fabs(rl.get(i));
    if (static_cast<int64_t>(tgt.get(i)) != op.ignore) loss_scale += rl_scale[i];  // the loss sums valid rows
  }
  if (op.red == Reduction::kMean) loss_scale /= valid.get(0);

  // device forward: every output poisoned (a sentinel where NaN is expected)
  const int64_t vs = vector_stride(lk), voff = vector_offset(lk);
  DeviceTensor d_x = to_device(x, logits_layout(lk));
  DevVec d_t(op.target, T, vs, voff);
  d_t.upload(tgt);
  DeviceTensor d_rl(F32, {T}, {0, voff}), d_lse(F32, {T}, {0, voff}), d_loss(F32, {}), d_valid(F32, {});
  const bool nan_loss = op.red != Reduction::kNone && std::isnan(loss.get(0));
  const size_t ws_bytes = kf::cross_entropy_workspace_size(T, V);
  DeviceTensor ws(F32, {static_cast<int64_t>((ws_bytes + 3) / 4)});
  ASSERT_TRUE(d_x.ok() && ws.ok());
  const TensorView xv = d_x.view(), tv = d_t.view(), rlv = d_rl.view(), lsev = d_lse.view(), lossv = d_loss.view(),
                   validv = d_valid.view();
  kf::CeCall fwd;  // the forward as the public entry builds it, for launch_with_plan
  fwd.name = "cross_entropy";
  fwd.opts = o;
  fwd.logits = &xv, fwd.target = &tv, fwd.row_loss = &rlv, fwd.lse_out = &lsev, fwd.loss = &lossv,
  fwd.valid_out = &validv;
  // Runs the forward (the public entry when plan is null) on poisoned outputs and checks them.
  auto forward = [&](const kf::CePlan* plan) {
    SCOPED_TRACE(plan ? kf::to_string(*plan) : std::string("default plan"));
    for (DeviceTensor* d : {&d_rl, &d_lse, &d_loss, &d_valid}) d->poison();
    if (nan_loss) d_loss.upload(filled(F32, {}, kSentinel));
    ASSERT_TRUE(
        finish(plan ? kf::launch_with_plan(*plan, fwd, ws.view().data, ws_bytes, stream_)
                    : kf::cross_entropy(xv, tv, o, rlv, lsev, lossv, validv, ws.view().data, ws_bytes, stream_)));
    EXPECT_TRUE(rows_close("lse", d_lse.download(), lse, lse_scale, tol.row));
    EXPECT_TRUE(rows_close("row_loss", d_rl.download(), rl, rl_scale, tol.row));
    EXPECT_EQ(d_valid.download().get(0), valid.get(0)) << "valid";
    const HostTensor g_loss = d_loss.download();
    if (op.red == Reduction::kNone) {
      EXPECT_TRUE(all_poison(g_loss)) << "loss is not written for Reduction::kNone, got " << g_loss.get(0);
    } else if (nan_loss) {
      EXPECT_TRUE(std::isnan(g_loss.get(0))) << "mean over no valid rows is NaN, got " << g_loss.get(0);
    } else {
      EXPECT_TRUE(std::isfinite(g_loss.get(0)) &&
                  std::fabs(g_loss.get(0) - loss.get(0)) <= tol.row * (loss_scale + 1e-30))
          << "loss: got " << g_loss.get(0) << " want " << loss.get(0) << " (tolerance " << tol.row * loss_scale << ")";
    }
    EXPECT_TRUE(d_rl.check_untouched("row_loss"));
    EXPECT_TRUE(d_lse.check_untouched("lse"));
    EXPECT_TRUE(d_loss.check_untouched("loss"));
    EXPECT_TRUE(d_valid.check_untouched("valid"));
    EXPECT_TRUE(d_x.check_untouched("logits"));
    EXPECT_TRUE(d_t.d.check_untouched("target"));
    EXPECT_TRUE(bit_equal("logits are not written by the forward", d_x.download(), x));
    EXPECT_TRUE(bit_equal("target is not written", d_t.download(), tgt));
  };
  forward(nullptr);
  if (HasFatalFailure()) return;
  const HostTensor g_lse = d_lse.download(), g_valid = d_valid.download();

  // backward: dloss random (scalar, or [T] strided for none); the GPU's lse and valid feed both
  HostTensor dloss(F32, op.red == Reduction::kNone ? std::vector<int64_t>{T} : std::vector<int64_t>{});
  for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, rng.uniform(0.5, 2.0) * (rng.uniform(0, 1) < 0.3 ? -1 : 1));
  HostTensor want(dt, {T, V});
  KF_ASSERT_OK(
      ref::cross_entropy_backward(dloss.view(), x.view(), tgt.view(), lse.view(), g_valid.view(), o, want.view()));
  const std::vector<double> G = row_g(tgt, op.ignore, op.red, dloss, g_valid.get(0));
  DevVec d_dl(F32, dloss.numel(), op.red == Reduction::kNone ? vs : 1);
  d_dl.upload(dloss);
  TensorView dl_view = d_dl.view();
  if (op.red != Reduction::kNone) dl_view.ndim = 0;  // [1] -> [] (the contract's shape for mean / sum)
  DeviceTensor d_dx(dt, {T, V}, dlogits_layout(lk));
  const TensorView dxv = d_dx.view();
  auto bwd_call = [&](const TensorView* logits, const TensorView* dlogits) {
    kf::CeCall c;
    c.name = "cross_entropy_backward";
    c.backward = true;
    c.opts = o;
    c.dloss = &dl_view, c.logits = logits, c.target = &tv, c.lse = &lsev, c.valid = &validv, c.dlogits = dlogits;
    return c;
  };

  // out of place (the public entry when plan is null)
  auto backward = [&](const kf::CePlan* plan) {
    SCOPED_TRACE(plan ? kf::to_string(*plan) : std::string("default plan"));
    d_dx.poison();
    ASSERT_TRUE(finish(plan ? kf::launch_with_plan(*plan, bwd_call(&xv, &dxv), nullptr, 0, stream_)
                            : kf::cross_entropy_backward(dl_view, xv, tv, lsev, validv, o, dxv, stream_)));
    EXPECT_TRUE(grad_close("dlogits", d_dx.download(), want, G, tol.grad));
    EXPECT_TRUE(d_dx.check_untouched("dlogits"));
    EXPECT_TRUE(bit_equal("logits are not written by the backward", d_x.download(), x));
    EXPECT_TRUE(bit_equal("target is not written by the backward", d_t.download(), tgt));
    EXPECT_TRUE(bit_equal("lse is not written by the backward", d_lse.download(), g_lse));
    EXPECT_TRUE(bit_equal("valid is not written by the backward", d_valid.download(), g_valid));
    HostTensor g_dl = d_dl.download();
    g_dl.shape = dloss.shape;
    EXPECT_TRUE(bit_equal("dloss is not written", g_dl, dloss));
    EXPECT_TRUE(d_dl.d.check_untouched("dloss"));
  };
  // in place: the gradient overwrites a fresh copy of the logits
  auto backward_in_place = [&](const kf::CePlan* plan) {
    SCOPED_TRACE(plan ? kf::to_string(*plan) : std::string("default plan"));
    DeviceTensor d_x2 = to_device(x, logits_layout(lk));
    const TensorView x2v = d_x2.view();
    ASSERT_TRUE(finish(plan ? kf::launch_with_plan(*plan, bwd_call(&x2v, &x2v), nullptr, 0, stream_)
                            : kf::cross_entropy_backward(dl_view, x2v, tv, lsev, validv, o, x2v, stream_)));
    EXPECT_TRUE(grad_close("dlogits in place", d_x2.download(), want, G, tol.grad));
    EXPECT_TRUE(d_x2.check_untouched("dlogits in place"));
  };
  backward(nullptr);
  backward_in_place(nullptr);

  // every candidate plan: backward out of place and in place (their layouts may allow other read
  // paths), then the forward (last: the backward above reads the default forward's lse)
  std::vector<kf::CePlan> plans;
  KF_ASSERT_OK(kf::ce_candidate_plans(bwd_call(&xv, &dxv), &plans));
  EXPECT_EQ(plans.empty(), T == 0);
  for (const kf::CePlan& plan : plans) backward(&plan);
  {
    DeviceTensor d_x2 = to_device(x, logits_layout(lk));  // the in-place call's layout
    const TensorView x2v = d_x2.view();
    KF_ASSERT_OK(kf::ce_candidate_plans(bwd_call(&x2v, &x2v), &plans));
  }
  for (const kf::CePlan& plan : plans) backward_in_place(&plan);
  KF_ASSERT_OK(kf::ce_candidate_plans(fwd, &plans));
  EXPECT_FALSE(plans.empty());
  for (const kf::CePlan& plan : plans) forward(&plan);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Shape s = std::get<1>(info.param);
  return std::string(dtype_tag(std::get<0>(info.param))) + "_" + std::to_string(s.rows) + "x" +
         std::to_string(s.vocab) + "_" + layout_name(std::get<2>(info.param)) + "_" + std::get<3>(info.param).name;
}

// Every shape and layout, mean reduction.
INSTANTIATE_TEST_SUITE_P(Shapes, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned,
                                                              LayoutKind::kMixed),
                                            ::testing::Values(kMeanOpt)),
                         case_name);

// Every option set on small and boundary shapes.
const Shape kOptShapes[] = {{7, 13}, {5, 4099}, {3, 16385}, {257, 130}};
INSTANTIATE_TEST_SUITE_P(Options, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kOptShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kOddStride,
                                                              LayoutKind::kUnaligned),
                                            ::testing::ValuesIn(kOpts)),
                         case_name);

// Vocabulary-parallel shards (class_start, num_classes) on small, boundary and large shapes.
const Shape kShardShapes[] = {{7, 13}, {3, 16385}, {257, 130}, {2, 64128}};
INSTANTIATE_TEST_SUITE_P(Shards, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kShardShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kUnaligned),
                                            ::testing::ValuesIn(kShardOpts)),
                         case_name);

// A few option sets on the large vocabularies (many segments per row).
const Shape kBigShapes[] = {{4, 32000}, {2, 128256}, {1, 262144}};
INSTANTIATE_TEST_SUITE_P(Big, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kBigShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kUnaligned),
                                            ::testing::ValuesIn(kBigOpts)),
                         case_name);

}  // namespace
