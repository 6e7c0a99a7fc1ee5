// The CUDA RoPE kernel against the float64 reference (kernelforge::ref::apply_rope), on the GPU.
//
// Every case runs both pairings (rotate-half, interleaved), forward and backward, on random q/k and
// random per-column cos/sin (not duplicated halves: a kernel that mixes up the cos/sin index of a
// pair's two members fails), with every output poisoned with NaN before the run; every element is
// compared with the one tolerance table per dtype, inputs must come back unchanged and bytes outside
// each output view (padding, base offset, guard) untouched. Cases cover: both layouts, GQA / MQA /
// q only, partial rotary (passthrough columns, a head_dim that is not a multiple of the vector),
// position_ids, [B, S, R] and [1, S, R] tables, odd S and B = 1, decode (S = 1), unaligned and
// padded views (the one-element path), in place, in place on a fused qkv buffer. Every case runs
// the public entry (the default plan) and then every candidate plan of the planner (flat and token
// kernels, both vector widths) through launch_with_plan. Tests skip without a GPU, and fail instead
// when KF_REQUIRE_GPU=1.
#include <string>
#include <tuple>
#include <vector>

#include "rope/rope_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::RopeLayout;
using kernelforge::RopeOptions;

enum class Tables { kSR, kBSR, k1SR, kCache };  // cos/sin [S, R], [B, S, R], [1, S, R], [P, R] + position_ids

struct RopeCase {
  const char* name;
  int64_t B, S, Hq, Hk, D, R;
  RopeLayout layout;
  Tables tables;
  Layout mem;    // row padding / base offset of q, k and the outputs (rows = heads of D columns)
  bool inplace;  // q_out is q, k_out is k
  bool fused;    // q and k are slices of one [B, S, Hq + 2 Hk, D] buffer (bshd), rotated in place
};

const RopeCase kCases[] = {
    {"llama_gqa", 2, 33, 8, 2, 128, 128, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"llama_bhsd", 2, 17, 8, 2, 128, 128, RopeLayout::kBHSD, Tables::kBSR, {}, false, false},
    {"decode_b1", 1, 1, 32, 8, 128, 128, RopeLayout::kBSHD, Tables::kCache, {}, false, false},
    {"positions", 3, 7, 4, 4, 64, 64, RopeLayout::kBSHD, Tables::kCache, {}, false, false},
    {"positions_bhsd", 2, 9, 3, 1, 64, 64, RopeLayout::kBHSD, Tables::kCache, {}, false, false},
    {"broadcast_1sr", 2, 5, 4, 2, 64, 64, RopeLayout::kBSHD, Tables::k1SR, {}, false, false},
    {"partial_half", 2, 11, 4, 2, 128, 64, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"partial_phi", 1, 13, 5, 5, 80, 32, RopeLayout::kBHSD, Tables::kBSR, {}, false, false},
    {"partial_tail_padded", 2, 5, 3, 2, 70, 64, RopeLayout::kBSHD, Tables::kSR, {2, 0}, false, false},
    {"odd_head_dim", 1, 7, 2, 1, 67, 66, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"unaligned", 2, 6, 4, 2, 64, 64, RopeLayout::kBSHD, Tables::kSR, {0, 1}, false, false},
    {"odd_stride", 2, 6, 4, 2, 64, 32, RopeLayout::kBHSD, Tables::kSR, {3, 0}, false, false},
    {"q_only", 2, 9, 6, 0, 128, 128, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"mqa", 1, 31, 16, 1, 96, 96, RopeLayout::kBSHD, Tables::kBSR, {}, false, false},
    {"tiny_r2", 2, 3, 2, 1, 8, 2, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"tiny_d2_one_head", 3, 50, 1, 0, 2, 2, RopeLayout::kBSHD, Tables::kBSR, {}, false, false},  // 64 tokens per block
    {"many_heads_d256", 1, 5, 40, 8, 256, 256, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"inplace", 2, 9, 4, 2, 128, 128, RopeLayout::kBSHD, Tables::kSR, {}, true, false},
    {"inplace_partial", 2, 9, 4, 2, 96, 64, RopeLayout::kBHSD, Tables::kCache, {}, true, false},
    {"fused_qkv_inplace", 2, 7, 8, 2, 128, 128, RopeLayout::kBSHD, Tables::kSR, {}, true, true},
    {"empty_seq", 2, 0, 4, 2, 64, 64, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    // flat (decode) kernel: 33 heads in groups of 17 + 16 (an idle row of threads), and 302 units
    // (one element each: unaligned) on 256 threads (the unit loop)
    {"decode_33_heads", 3, 1, 29, 4, 128, 128, RopeLayout::kBSHD, Tables::kSR, {}, false, false},
    {"wide_head_unaligned", 1, 2, 2, 1, 602, 600, RopeLayout::kBSHD, Tables::kSR, {0, 1}, false, false},
};

std::vector<int64_t> shape_of(RopeLayout l, int64_t B, int64_t S, int64_t H, int64_t D) {
  return l == RopeLayout::kBSHD ? std::vector<int64_t>{B, S, H, D} : std::vector<int64_t>{B, H, S, D};
}

// (dtype of q/k, cos/sin float32?)
using Param = std::tuple<DType, bool>;

class RopeGpu : public ::testing::TestWithParam<Param> {
 protected:
  cudaStream_t stream_ = nullptr;
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
  DType cs_dtype() const { return std::get<1>(GetParam()) ? DType::kFloat32 : dtype(); }
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  void run_case(const RopeCase& c, bool interleaved, bool backward);
};

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// A view of heads [h0, h0 + H) of a bshd buffer view [B, S, Ht, D].
TensorView heads_of(TensorView v, int64_t h0, int64_t H) {
  v.data = static_cast<char*>(v.data) + h0 * v.strides[2] * int64_t(kf::dtype_size(v.dtype));
  v.shape[2] = H;
  return v;
}

void RopeGpu::run_case(const RopeCase& c, bool interleaved, bool backward) {
  const DType t = dtype(), ct = cs_dtype();
  const std::string tag =
      std::string(c.name) + (interleaved ? " interleaved" : " rotate-half") + (backward ? " bwd" : " fwd");
  SCOPED_TRACE(tag);
  Rng rng(hash_str(tag + dtype_name(t) + dtype_name(ct)));
  RopeOptions o;
  o.layout = c.layout;
  o.interleaved = interleaved;
  const int64_t P = 37;  // cache rows
  HostTensor cos, sin, pos;
  switch (c.tables) {
    case Tables::kSR:
      cos = random_tensor(ct, {c.S, c.R}, rng, -1, 1), sin = random_tensor(ct, {c.S, c.R}, rng, -1, 1);
      break;
    case Tables::kBSR:
      cos = random_tensor(ct, {c.B, c.S, c.R}, rng, -1, 1), sin = random_tensor(ct, {c.B, c.S, c.R}, rng, -1, 1);
      break;
    case Tables::k1SR:
      cos = random_tensor(ct, {1, c.S, c.R}, rng, -1, 1), sin = random_tensor(ct, {1, c.S, c.R}, rng, -1, 1);
      break;
    case Tables::kCache: {
      cos = random_tensor(ct, {P, c.R}, rng, -1, 1), sin = random_tensor(ct, {P, c.R}, rng, -1, 1);
      pos = HostTensor(DType::kInt64, {c.B, c.S});
      int64_t* pv = reinterpret_cast<int64_t*>(pos.bytes.data());
      for (int64_t i = 0; i < c.B * c.S; ++i) pv[i] = int64_t(rng.next() % uint64_t(P));
      break;
    }
  }
  const bool has_pos = c.tables == Tables::kCache;
  DeviceTensor dcos = to_device(cos, {}), dsin = to_device(sin, {});
  DeviceTensor dpos = has_pos ? to_device(pos, {}) : DeviceTensor();
  const TensorView hpos = has_pos ? pos.view() : TensorView{};
  const TensorView dposv = has_pos ? dpos.view() : TensorView{};
  auto call_ref = [&](const TensorView& q, const TensorView* k, const TensorView& qo, const TensorView* ko) {
    return backward ? ref::apply_rope_backward(q, k, cos.view(), sin.view(), has_pos ? &hpos : nullptr, o, qo, ko)
                    : ref::apply_rope(q, k, cos.view(), sin.view(), has_pos ? &hpos : nullptr, o, qo, ko);
  };
  const TensorView cosv = dcos.view(), sinv = dsin.view();

  // Run 0 is the public entry (the default plan); it also lists the call's candidate plans, and every
  // one of them then runs through launch_with_plan on fresh buffers.
  std::vector<kf::RopePlan> plans;
  size_t run = 0;
  auto call_gpu = [&](const TensorView& q, const TensorView* k, const TensorView& qo, const TensorView* ko) {
    kf::RopeCall rc;
    rc.name = backward ? "apply_rope_backward" : "apply_rope";
    rc.backward = backward;
    rc.q = &q, rc.k = k, rc.cos = &cosv, rc.sin = &sinv, rc.pos = has_pos ? &dposv : nullptr, rc.opts = o;
    rc.q_out = &qo, rc.k_out = ko;
    if (run > 0) return kf::launch_with_plan(plans[run - 1], rc, stream_);
    const Status s = kf::rope_candidate_plans(rc, &plans);
    if (!s.ok()) return s;
    EXPECT_EQ(plans.empty(), c.S == 0);
    return backward ? kf::apply_rope_backward(q, k, cosv, sinv, rc.pos, o, qo, ko, stream_)
                    : kf::apply_rope(q, k, cosv, sinv, rc.pos, o, qo, ko, stream_);
  };

  if (c.fused) {  // one [B, S, Hq + 2 Hk, D] buffer; q and k rotated in place, v untouched
    const int64_t Ht = c.Hq + 2 * c.Hk;
    HostTensor qkv = random_tensor(t, {c.B, c.S, Ht, c.D}, rng);
    HostTensor want = qkv;
    TensorView hq = heads_of(want.view(), 0, c.Hq), hk = heads_of(want.view(), c.Hq, c.Hk);
    KF_ASSERT_OK(call_ref(hq, &hk, hq, &hk));
    for (run = 0; run <= plans.size(); ++run) {
      SCOPED_TRACE(run == 0 ? std::string("default plan") : kf::to_string(plans[run - 1]));
      DeviceTensor d = to_device(qkv, c.mem);
      TensorView dq = heads_of(d.view(), 0, c.Hq), dk = heads_of(d.view(), c.Hq, c.Hk);
      ASSERT_TRUE(finish(call_gpu(dq, &dk, dq, &dk)));
      EXPECT_TRUE(all_close("qkv", d.download(), want, tolerance(t)));
      EXPECT_TRUE(d.check_untouched("qkv"));
    }
    return;
  }

  HostTensor q = random_tensor(t, shape_of(c.layout, c.B, c.S, c.Hq, c.D), rng);
  HostTensor k = random_tensor(t, shape_of(c.layout, c.B, c.S, c.Hk, c.D), rng);
  const bool has_k = c.Hk > 0;
  HostTensor qw(t, q.shape), kw(t, k.shape);
  TensorView hk = k.view(), hkw = kw.view();
  KF_ASSERT_OK(call_ref(q.view(), has_k ? &hk : nullptr, qw.view(), has_k ? &hkw : nullptr));

  for (run = 0; run <= plans.size(); ++run) {
    SCOPED_TRACE(run == 0 ? std::string("default plan") : kf::to_string(plans[run - 1]));
    DeviceTensor dq = to_device(q, c.mem), dk = to_device(k, c.mem);
    TensorView dqv = dq.view(), dkv = dk.view();
    if (c.inplace) {
      ASSERT_TRUE(finish(call_gpu(dqv, has_k ? &dkv : nullptr, dqv, has_k ? &dkv : nullptr)));
      EXPECT_TRUE(all_close("q (in place)", dq.download(), qw, tolerance(t)));
      EXPECT_TRUE(dq.check_untouched("q"));
      if (has_k) {
        EXPECT_TRUE(all_close("k (in place)", dk.download(), kw, tolerance(t)));
        EXPECT_TRUE(dk.check_untouched("k"));
      }
      continue;
    }
    DeviceTensor dqo(t, q.shape, c.mem), dko(t, k.shape, c.mem);
    TensorView dqov = dqo.view(), dkov = dko.view();
    ASSERT_TRUE(finish(call_gpu(dqv, has_k ? &dkv : nullptr, dqov, has_k ? &dkov : nullptr)));
    EXPECT_TRUE(all_close("q_out", dqo.download(), qw, tolerance(t)));
    EXPECT_TRUE(dqo.check_untouched("q_out"));
    EXPECT_TRUE(bit_equal("q is not written", dq.download(), q));
    if (has_k) {
      EXPECT_TRUE(all_close("k_out", dko.download(), kw, tolerance(t)));
      EXPECT_TRUE(dko.check_untouched("k_out"));
      EXPECT_TRUE(bit_equal("k is not written", dk.download(), k));
    }
  }
}

TEST_P(RopeGpu, AllCases) {
  for (const RopeCase& c : kCases)
    for (bool interleaved : {false, true})
      for (bool backward : {false, true}) {
        run_case(c, interleaved, backward);
        if (HasFatalFailure()) return;
      }
}

// Out-of-range position_ids: rotated columns NaN, passthrough columns copied, nothing read outside
// the cache (run under compute-sanitizer to see the latter).
TEST_P(RopeGpu, PositionOutOfRange) {
  const DType t = dtype(), ct = cs_dtype();
  const int64_t B = 1, S = 3, H = 2, D = 16, R = 8, P = 4;
  Rng rng(hash_str("oob"));
  HostTensor q = random_tensor(t, {B, S, H, D}, rng);
  HostTensor cos = random_tensor(ct, {P, R}, rng), sin = random_tensor(ct, {P, R}, rng);
  HostTensor pos(DType::kInt64, {B, S});
  int64_t* pv = reinterpret_cast<int64_t*>(pos.bytes.data());
  pv[0] = 1, pv[1] = P, pv[2] = -1;
  DeviceTensor dq = to_device(q, {}), dqo(t, q.shape), dcos = to_device(cos, {}), dsin = to_device(sin, {}),
               dpos = to_device(pos, {});
  const TensorView pview = dpos.view();
  ASSERT_TRUE(
      finish(kf::apply_rope(dq.view(), nullptr, dcos.view(), dsin.view(), &pview, {}, dqo.view(), nullptr, stream_)));
  const HostTensor got = dqo.download();
  for (int64_t s = 1; s < S; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < D; ++c) {
        const int64_t i = (s * H + h) * D + c;
        if (c < R)
          EXPECT_TRUE(std::isnan(got.get(i))) << "token " << s << " column " << c;
        else
          EXPECT_EQ(got.get(i), q.get(i)) << "token " << s << " column " << c;
      }
  for (int64_t i = 0; i < H * D; ++i) EXPECT_TRUE(std::isfinite(got.get(i))) << "token 0 (valid position)";
}

// Two runs give identical bits (every output element has one writer).
TEST_P(RopeGpu, Deterministic) {
  const DType t = dtype(), ct = cs_dtype();
  Rng rng(hash_str("det"));
  HostTensor q = random_tensor(t, {2, 64, 8, 128}, rng), k = random_tensor(t, {2, 64, 2, 128}, rng);
  HostTensor cos = random_tensor(ct, {64, 128}, rng), sin = random_tensor(ct, {64, 128}, rng);
  DeviceTensor dq = to_device(q, {}), dk = to_device(k, {}), dcos = to_device(cos, {}), dsin = to_device(sin, {});
  HostTensor out[2][2];
  for (int run = 0; run < 2; ++run) {
    DeviceTensor qo(t, q.shape), ko(t, k.shape);
    const TensorView kv = dk.view(), kov = ko.view();
    ASSERT_TRUE(
        finish(kf::apply_rope(dq.view(), &kv, dcos.view(), dsin.view(), nullptr, {}, qo.view(), &kov, stream_)));
    out[run][0] = qo.download();
    out[run][1] = ko.download();
  }
  EXPECT_TRUE(bit_equal("q_out", out[0][0], out[1][0]));
  EXPECT_TRUE(bit_equal("k_out", out[0][1], out[1][1]));
}

INSTANTIATE_TEST_SUITE_P(All, RopeGpu,
                         ::testing::Values(Param{DType::kFloat32, true}, Param{DType::kFloat16, false},
                                           Param{DType::kFloat16, true}, Param{DType::kBFloat16, false},
                                           Param{DType::kBFloat16, true}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const DType t = std::get<0>(info.param);
                           const char* tag = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
                           return std::string(tag) + (std::get<1>(info.param) ? "_cs_fp32" : "_cs_same");
                         });

}  // namespace
