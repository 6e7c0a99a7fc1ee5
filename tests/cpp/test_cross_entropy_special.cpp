// Special cases of the CUDA cross-entropy kernels, per dtype: out-of-range targets (NaN rows), every
// row ignored, two runs bit-identical, many rows (several finalize blocks). Shared helpers and
// tolerances in test_cross_entropy_util.h; the main cases in test_cross_entropy.cpp.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "test_cross_entropy_util.h"

namespace {

// ---- special cases (per dtype) ----------------------------------------------------------------------
class CeGpuSpecial : public CeGpuBase, public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    if (GetParam() == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  struct Fwd {
    DeviceTensor rl, lse, loss, valid, ws;
    size_t ws_bytes;
    Fwd(int64_t T, int64_t V)
        : rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {}), ws_bytes(kf::cross_entropy_workspace_size(T, V)) {
      ws = DeviceTensor(F32, {static_cast<int64_t>((ws_bytes + 3) / 4)});
    }
    Status run(const TensorView& x, const TensorView& t, const CrossEntropyOptions& o, cudaStream_t s) {
      return kf::cross_entropy(x, t, o, rl.view(), lse.view(), loss.view(), valid.view(), ws.view().data, ws_bytes, s);
    }
  };
};

// A target outside [0, V) that is not ignore_index: on the GPU that row's row_loss, lse and gradient
// row are NaN (the row counts as valid, so a mean or sum is NaN); the other rows are exact.
TEST_P(CeGpuSpecial, OutOfRangeTarget) {
  const DType dt = GetParam();
  const CeTol tol = ce_tolerance(dt);
  for (int64_t V : {int64_t{7}, int64_t{4099}}) {
    for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      for (DType tdt : {I64, I32}) {
        SCOPED_TRACE("V " + std::to_string(V) + ", reduction " + std::to_string(static_cast<int>(red)) + ", " +
                     dtype_name(tdt));
        const int64_t T = 6;
        Rng rng(seed("oor" + std::to_string(V) + std::to_string(static_cast<int>(red)) + dtype_name(tdt)));
        const HostTensor x = random_logits(dt, T, V, 3.0, rng);
        HostTensor tgt(tdt, {T}), tgt_ok(tdt, {T});  // tgt_ok: the bad rows ignored (the reference's input)
        const std::vector<int64_t> tv = {V - 1, -100, V, 0, -1, 3};
        const std::set<int64_t> bad = {2, 4};
        for (int64_t i = 0; i < T; ++i) {
          tgt.set(i, static_cast<double>(tv[i]));
          tgt_ok.set(i, bad.count(i) ? -100.0 : static_cast<double>(tv[i]));
        }
        CrossEntropyOptions o;
        o.reduction = red;
        o.label_smoothing = 0.05;
        HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
        // the reference itself refuses the bad targets; it gets them ignored instead
        EXPECT_FALSE(
            ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()).ok());
        KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt_ok.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));

        DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
        Fwd f(T, V);
        f.rl.upload(filled(F32, {T}, kSentinel));  // a NaN row must be written, not left poisoned
        f.lse.upload(filled(F32, {T}, kSentinel));
        if (red != Reduction::kNone) f.loss.upload(filled(F32, {}, kSentinel));
        ASSERT_TRUE(finish(f.run(d_x.view(), d_t.view(), o, stream_)));
        std::vector<double> lse_scale(T), rl_scale(T);
        for (int64_t i = 0; i < T; ++i) {
          lse_scale[i] = 1 + std::fabs(lse.get(i));
          rl_scale[i] = lse_scale[i] + std::fabs(rl.get(i));
        }
        const HostTensor g_valid = f.valid.download();
        EXPECT_TRUE(rows_close("lse", f.lse.download(), lse, lse_scale, tol.row, bad));
        EXPECT_TRUE(rows_close("row_loss", f.rl.download(), rl, rl_scale, tol.row, bad));
        EXPECT_EQ(g_valid.get(0), valid.get(0) + 2) << "the out-of-range rows count as valid";
        if (red != Reduction::kNone) {
          EXPECT_TRUE(std::isnan(f.loss.download().get(0))) << "the loss is NaN";
        }
        if (red == Reduction::kNone) {
          EXPECT_TRUE(all_poison(f.loss.download()));
        }

        // backward: out of place and in place; the reference (bad rows ignored) with the GPU's valid
        HostTensor dloss(F32, red == Reduction::kNone ? std::vector<int64_t>{T} : std::vector<int64_t>{});
        for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, rng.uniform(0.5, 2.0));
        HostTensor want(dt, {T, V});
        KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), tgt_ok.view(), lse.view(), g_valid.view(), o,
                                                 want.view()));
        const std::vector<double> G = row_g(tgt_ok, -100, red, dloss, g_valid.get(0));
        DeviceTensor d_dl = to_device(dloss, {});
        DeviceTensor d_dx = to_device(filled(dt, {T, V}, kSentinel), {});
        ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                      o, d_dx.view(), stream_)));
        EXPECT_TRUE(grad_close("dlogits", d_dx.download(), want, G, tol.grad, bad));
        ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                      o, d_x.view(), stream_)));
        EXPECT_TRUE(grad_close("dlogits in place", d_x.download(), want, G, tol.grad, bad));
      }
    }
  }
}

// Every row ignored: row_loss 0, lse still written, valid 0, the mean NaN (0 / 0), the sum 0, and a
// zero gradient (the mean's 0 / 0 never reaches it), in place too.
TEST_P(CeGpuSpecial, AllRowsIgnored) {
  const DType dt = GetParam();
  const CeTol tol = ce_tolerance(dt);
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (DType tdt : {I64, I32}) {
      SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(red)) + ", " + dtype_name(tdt));
      const int64_t T = 5, V = 1000;
      Rng rng(seed("ignored" + std::to_string(static_cast<int>(red)) + dtype_name(tdt)));
      const HostTensor x = random_logits(dt, T, V, 3.0, rng);
      const HostTensor tgt = filled(tdt, {T}, -100);
      CrossEntropyOptions o;
      o.reduction = red;
      o.z_loss_scale = 1e-4;
      HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
      KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));
      DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
      Fwd f(T, V);
      f.rl.upload(filled(F32, {T}, kSentinel));
      f.valid.upload(filled(F32, {}, kSentinel));
      if (red != Reduction::kNone) f.loss.upload(filled(F32, {}, kSentinel));
      ASSERT_TRUE(finish(f.run(d_x.view(), d_t.view(), o, stream_)));
      const HostTensor g_rl = f.rl.download(), g_valid = f.valid.download(), g_loss = f.loss.download();
      for (int64_t i = 0; i < T; ++i) EXPECT_EQ(g_rl.get(i), 0.0) << "row " << i;
      std::vector<double> lse_scale(T);
      for (int64_t i = 0; i < T; ++i) lse_scale[i] = 1 + std::fabs(lse.get(i));
      EXPECT_TRUE(rows_close("lse", f.lse.download(), lse, lse_scale, tol.row));
      EXPECT_EQ(g_valid.get(0), 0.0);
      if (red == Reduction::kMean) {
        EXPECT_TRUE(std::isnan(g_loss.get(0))) << g_loss.get(0);
      }
      if (red == Reduction::kSum) {
        EXPECT_EQ(g_loss.get(0), 0.0);
      }
      if (red == Reduction::kNone) {
        EXPECT_TRUE(all_poison(g_loss));
      }

      HostTensor dloss = filled(F32, red == Reduction::kNone ? std::vector<int64_t>{T} : std::vector<int64_t>{}, 1.5);
      DeviceTensor d_dl = to_device(dloss, {});
      DeviceTensor d_dx(dt, {T, V});
      ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                    o, d_dx.view(), stream_)));
      const HostTensor zeros = filled(dt, {T, V}, 0.0);
      EXPECT_TRUE(bit_equal("dlogits (all zero)", d_dx.download(), zeros));
      ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                    o, d_x.view(), stream_)));
      EXPECT_TRUE(bit_equal("dlogits in place (all zero)", d_x.download(), zeros));
    }
  }
}

// The reduction is deterministic (fixed order, no atomics): two runs give identical bits, for the
// loss over two finalize blocks and over many segments, and the gradient too.
TEST_P(CeGpuSpecial, Deterministic) {
  const DType dt = GetParam();
  for (Shape s : {Shape{257, 130}, Shape{4, 32000}}) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.vocab));
    Rng rng(seed("det" + std::to_string(s.vocab)));
    const HostTensor x = random_logits(dt, s.rows, s.vocab, 3.0, rng);
    const HostTensor tgt = make_targets(I64, s.rows, s.vocab, -100, rng);
    CrossEntropyOptions o;
    o.label_smoothing = 0.1;
    DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
    Fwd a(s.rows, s.vocab), b(s.rows, s.vocab);
    ASSERT_TRUE(finish(a.run(d_x.view(), d_t.view(), o, stream_)));
    ASSERT_TRUE(finish(b.run(d_x.view(), d_t.view(), o, stream_)));
    EXPECT_TRUE(bit_equal("row_loss", a.rl.download(), b.rl.download()));
    EXPECT_TRUE(bit_equal("lse", a.lse.download(), b.lse.download()));
    EXPECT_TRUE(bit_equal("loss", a.loss.download(), b.loss.download()));
    DeviceTensor d_dl = to_device(filled(F32, {}, 1.0), {});
    DeviceTensor g1(dt, {s.rows, s.vocab}), g2(dt, {s.rows, s.vocab});
    ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), a.lse.view(), a.valid.view(), o,
                                                  g1.view(), stream_)));
    ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), a.lse.view(), a.valid.view(), o,
                                                  g2.view(), stream_)));
    EXPECT_TRUE(bit_equal("dlogits", g1.download(), g2.download()));
  }
}

// More rows than the one-block reduction has threads x finalize rows (512 x 256): its loop runs.
TEST_P(CeGpuSpecial, ManyRows) {
  const DType dt = GetParam();
  const CeTol tol = ce_tolerance(dt);
  const int64_t T = 140000, V = 3;
  Rng rng(seed("many"));
  const HostTensor x = random_logits(dt, T, V, 3.0, rng);
  const HostTensor tgt = make_targets(I32, T, V, -100, rng);
  CrossEntropyOptions o;
  HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
  KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));
  DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
  Fwd f(T, V);
  ASSERT_TRUE(finish(f.run(d_x.view(), d_t.view(), o, stream_)));
  std::vector<double> rl_scale(T);
  double loss_scale = 0;
  for (int64_t i = 0; i < T; ++i) loss_scale += rl_scale[i] = 1 + std::fabs(lse.get(i)) + std::fabs(rl.get(i));
  EXPECT_TRUE(rows_close("row_loss", f.rl.download(), rl, rl_scale, tol.row));
  EXPECT_EQ(f.valid.download().get(0), valid.get(0));
  const double got = f.loss.download().get(0);
  EXPECT_NEAR(got, loss.get(0), tol.row * loss_scale / valid.get(0));
}

INSTANTIATE_TEST_SUITE_P(All, CeGpuSpecial, KF_CE_DTYPES, [](const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_tag(info.param));
});

}  // namespace
