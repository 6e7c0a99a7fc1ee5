// Argument validation of the attention family: a bad call returns kInvalidArgument with a message
// that names the entry, the argument and what was expected, and nothing is launched. Validation runs
// before any device query, so these need no GPU: the views point at dummy addresses never
// dereferenced (the CUDA calls are size queries, workspace == nullptr, which launch nothing even
// where a GPU is present). The CPU reference runs the same checks. The last tests read the params
// and the problem that validation fills.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::AttentionLayout;
using kernelforge::AttentionOptions;
using kernelforge::AttentionTensors;
using kernelforge::StatusCode;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType F64 = DType::kFloat64;
constexpr DType I32 = DType::kInt32;

uintptr_t addr(int i) { return uintptr_t(i) << 36; }  // distinct, far-apart, 16-byte aligned dummy addresses

// A valid GQA call, bshd: q [2, 16, 8, 128], k / v [2, 32, 2, 128], out [2, 16, 8, 128], lse [2, 8, 16],
// sinks [8] (float32). varlen() turns it into a packed call of 3 sequences.
struct Call {
  TensorView q = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(1));
  TensorView k = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(2));
  TensorView v = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(3));
  TensorView out = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(4));
  TensorView lse = cuda_view(F32, {2, 8, 16}, 0, addr(5));
  TensorView sinks = cuda_view(F32, {8}, 0, addr(6));
  TensorView cuq = cuda_view(I32, {3}, 0, addr(7));
  TensorView cuk = cuda_view(I32, {3}, 0, addr(8));
  bool has_lse = true, has_sinks = true, has_cu = false;
  AttentionOptions o;

  void varlen() {
    o.layout = AttentionLayout::kVarlen;
    q = cuda_view(BF16, {40, 8, 128}, 0, addr(1));
    k = cuda_view(BF16, {50, 2, 128}, 0, addr(2));
    v = cuda_view(BF16, {50, 2, 128}, 0, addr(3));
    out = cuda_view(BF16, {40, 8, 128}, 0, addr(4));
    lse = cuda_view(F32, {8, 40}, 0, addr(5));
    has_cu = true;
  }
  void on_cpu() {
    for (TensorView* t : {&q, &k, &v, &out, &lse, &sinks, &cuq, &cuk}) t->device = Device{DeviceType::kCPU, 0};
  }
  AttentionTensors tensors() const {
    AttentionTensors t;
    t.q = &q, t.k = &k, t.v = &v, t.out = &out;
    t.lse = has_lse ? &lse : nullptr;
    t.sinks = has_sinks ? &sinks : nullptr;
    t.cu_seqlens_q = has_cu ? &cuq : nullptr;
    t.cu_seqlens_k = has_cu ? &cuk : nullptr;
    return t;
  }
  // The one-call CUDA entry as a size query (validates, launches nothing).
  Status run() const {
    size_t bytes = 0;
    return kf::attention_forward(tensors(), o, nullptr, &bytes, nullptr);
  }
  Status plan() const {
    kf::AttentionPlan p;
    size_t bytes = 0;
    return kf::attention_plan(tensors(), o, &p, &bytes);
  }
  // The CPU reference on the same views moved to the CPU (an invalid call never reads them).
  Status run_ref() const {
    Call c = *this;
    c.on_cpu();
    return ref::attention_forward(c.tensors(), c.o);
  }
  // Fills params through the internal validation (CUDA call).
  Status params(kf::AttentionParams* p, DType* t) const {
    kf::AttentionCall c;
    c.t = tensors();
    c.opts = o;
    return kf::validate_attention(c, p, t);
  }
};

// A call that validates: Ok where a GPU is present (a size query), a device error where none is.
#define KF_EXPECT_VALID(status_expr)                                                     \
  do {                                                                                   \
    const ::kernelforge::Status _st = (status_expr);                                     \
    EXPECT_NE(_st.code(), ::kernelforge::StatusCode::kInvalidArgument) << _st.message(); \
  } while (0)

TEST(AttentionValidation, ValidCallsPass) {
  Call c;
  KF_EXPECT_VALID(c.run());
  KF_EXPECT_VALID(c.plan());
  Call v;
  v.varlen();
  KF_EXPECT_VALID(v.run());
  Call m;  // MLA prefill head dims, MQA, bfloat16 sinks, causal with a left window, softcap
  m.q = cuda_view(BF16, {1, 7, 16, 192}, 0, addr(1));
  m.k = cuda_view(BF16, {1, 9, 1, 192}, 0, addr(2));
  m.v = cuda_view(BF16, {1, 9, 1, 128}, 0, addr(3));
  m.out = cuda_view(BF16, {1, 7, 16, 128}, 0, addr(4));
  m.lse = cuda_view(F32, {1, 16, 7}, 0, addr(5));
  m.sinks = cuda_view(BF16, {16}, 0, addr(6));
  m.o.causal = true;
  m.o.window_right = 0;
  m.o.window_left = 4;
  m.o.softcap = 30.0f;
  KF_EXPECT_VALID(m.run());
  Call e;  // empty batch and Sk = 0
  e.q = cuda_view(BF16, {0, 16, 8, 128}, 0, addr(1));
  e.k = e.v = cuda_view(BF16, {0, 0, 2, 128}, 0, addr(2));
  e.out = cuda_view(BF16, {0, 16, 8, 128}, 0, addr(4));
  e.lse = cuda_view(F32, {0, 8, 16}, 0, addr(5));
  KF_EXPECT_VALID(e.run());
}

TEST(AttentionValidation, NullTensors) {
  Call c;
  AttentionTensors t = c.tensors();
  size_t bytes = 0;
  t.q = nullptr;
  KF_EXPECT_INVALID(kf::attention_forward(t, c.o, nullptr, &bytes, nullptr), "attention_forward: q must not be null");
  t = c.tensors(), t.k = nullptr;
  KF_EXPECT_INVALID(kf::attention_forward(t, c.o, nullptr, &bytes, nullptr), "k must not be null");
  t = c.tensors(), t.v = nullptr;
  KF_EXPECT_INVALID(ref::attention_forward(t, c.o), "attention_forward: v must not be null");
  t = c.tensors(), t.out = nullptr;
  KF_EXPECT_INVALID(kf::attention_forward(t, c.o, nullptr, &bytes, nullptr), "out must not be null");
  KF_EXPECT_INVALID(kf::attention_forward(c.tensors(), c.o, nullptr, nullptr, nullptr),
                    "attention_forward: workspace_bytes must not be null");
  kf::AttentionPlan p;
  KF_EXPECT_INVALID(kf::attention_plan(c.tensors(), c.o, &p, nullptr), "attention_plan: plan and workspace_bytes");
  t = c.tensors(), t.q = nullptr;
  KF_EXPECT_INVALID(kf::attention_plan(t, c.o, &p, &bytes), "attention_plan: q must not be null");
}

TEST(AttentionValidation, Dtypes) {
  Call c;
  c.q.dtype = F32;
  KF_EXPECT_INVALID(c.run(), "attention_forward: q must be a float16/bfloat16 tensor, got float32");
  KF_EXPECT_INVALID(c.run_ref(), "attention_forward: q must be a float16/bfloat16/float64 tensor, got float32");
  c.q.dtype = F64;  // the reference only
  KF_EXPECT_INVALID(c.run(), "q must be a float16/bfloat16 tensor, got float64");
  KF_EXPECT_INVALID(c.plan(), "attention_plan: q must be a float16/bfloat16 tensor, got float64");
  Call k;
  k.k.dtype = F16;
  KF_EXPECT_INVALID(k.run(), "k must have the dtype of q (bfloat16), got float16");
  KF_EXPECT_INVALID(k.run_ref(), "k must have the dtype of q (bfloat16), got float16");
  Call v;
  v.v.dtype = F32;
  KF_EXPECT_INVALID(v.run(), "v must have the dtype of q (bfloat16), got float32");
  Call o;
  o.out.dtype = F16;
  KF_EXPECT_INVALID(o.run(), "out must have the dtype of q (bfloat16), got float16");
  Call l;
  l.lse.dtype = BF16;
  KF_EXPECT_INVALID(l.run(), "lse must be a float32 tensor, got bfloat16");
  KF_EXPECT_INVALID(l.run_ref(), "lse must be a float32/float64 tensor, got bfloat16");
  l.lse.dtype = F64;
  KF_EXPECT_INVALID(l.run(), "lse must be a float32 tensor, got float64");
  Call s;
  s.sinks.dtype = F16;
  KF_EXPECT_INVALID(s.run(), "sinks must be float32 or the dtype of q (bfloat16), got float16");
  s.sinks.dtype = F64;
  KF_EXPECT_INVALID(s.run(), "sinks must be float32 or the dtype of q (bfloat16), got float64");
  s.sinks.dtype = BF16;
  KF_EXPECT_VALID(s.run());
  Call u;
  u.varlen();
  u.cuk.dtype = DType::kInt64;
  KF_EXPECT_INVALID(u.run(), "cu_seqlens_k must be an int32 tensor, got int64");
}

TEST(AttentionValidation, Devices) {
  Call c;
  c.q.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(c.run(), "q must be a CUDA tensor, got cpu (use kernelforge::ref:: for CPU)");
  Call r;
  KF_EXPECT_INVALID(ref::attention_forward(r.tensors(), r.o), "q must be a CPU tensor for the reference, got cuda:0");
  Call k;
  k.k.device.index = 1;
  KF_EXPECT_INVALID(k.run(), "k must be on the same device as q (cuda:0), got cuda:1");
  Call o;
  o.out.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(o.run(), "out must be on the same device as q (cuda:0), got cpu");
  Call l;
  l.lse.device.index = 2;
  KF_EXPECT_INVALID(l.run(), "lse must be on the same device as q (cuda:0), got cuda:2");
  Call s;
  s.sinks.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(s.run(), "sinks must be on the same device as q (cuda:0), got cpu");
  Call u;
  u.varlen();
  u.cuq.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(u.run(), "cu_seqlens_q must be on the same device as q (cuda:0), got cpu");
  Call rv;  // the reference: every tensor on the CPU
  rv.on_cpu();
  rv.v.device = Device{DeviceType::kCUDA, 0};
  KF_EXPECT_INVALID(ref::attention_forward(rv.tensors(), rv.o), "v must be on the same device as q (cpu), got cuda:0");
}

TEST(AttentionValidation, RanksAndShapes) {
  Call c;
  c.q = cuda_view(BF16, {2, 16, 1024}, 0, addr(1));
  KF_EXPECT_INVALID(c.run(), "q must have 4 dimensions [B, Sq, Hq, Dqk] (layout bshd), got 3 dimensions [2, 16, 1024]");
  Call b;
  b.o.layout = AttentionLayout::kBHSD;
  b.k = cuda_view(BF16, {2, 32, 2}, 0, addr(2));
  KF_EXPECT_INVALID(b.run(), "k must have 4 dimensions [B, Hkv, Sk, Dqk] (layout bhsd), got 3 dimensions");
  Call vl;
  vl.varlen();
  vl.q = cuda_view(BF16, {2, 20, 8, 128}, 0, addr(1));
  KF_EXPECT_INVALID(vl.run(), "q must have 3 dimensions [Tq, Hq, Dqk] (layout varlen), got 4 dimensions");
  Call k;
  k.k = cuda_view(BF16, {3, 32, 2, 128}, 0, addr(2));
  KF_EXPECT_INVALID(k.run(), "k must have shape [2, 32, 2, 128] (the B and Dqk of q), got [3, 32, 2, 128]");
  k.k = cuda_view(BF16, {2, 32, 2, 64}, 0, addr(2));
  KF_EXPECT_INVALID(k.run_ref(), "k must have shape [2, 32, 2, 128] (the B and Dqk of q), got [2, 32, 2, 64]");
  Call v;
  v.v = cuda_view(BF16, {2, 31, 2, 128}, 0, addr(3));
  KF_EXPECT_INVALID(v.run(), "v must have shape [2, 32, 2, 128] (the B, Sk and Hkv of k), got [2, 31, 2, 128]");
  Call o;
  o.out = cuda_view(BF16, {2, 16, 4, 128}, 0, addr(4));
  KF_EXPECT_INVALID(o.run(), "out must have shape [2, 16, 8, 128] (the B, Sq and Hq of q, the Dv of v), got");
  Call bo;  // bhsd reads q [2, 16, 8, 128] as B 2, Hq 16, Sq 8
  bo.o.layout = AttentionLayout::kBHSD;
  bo.k = bo.v = cuda_view(BF16, {2, 4, 32, 128}, 0, addr(2));
  bo.lse = cuda_view(F32, {2, 16, 8}, 0, addr(5));
  bo.has_sinks = false;
  KF_EXPECT_VALID(bo.run());
  bo.lse = cuda_view(F32, {2, 8, 16}, 0, addr(5));
  KF_EXPECT_INVALID(bo.run(), "lse must have shape [2, 16, 8] ([B, Hq, Sq] of q), got [2, 8, 16]");
  Call g;
  g.k = g.v = cuda_view(BF16, {2, 32, 3, 128}, 0, addr(2));
  KF_EXPECT_INVALID(g.run(), "the heads of q (Hq = 8) must be a multiple of the heads of k and v (Hkv = 3)");
  g.k = g.v = cuda_view(BF16, {2, 32, 0, 128}, 0, addr(2));
  KF_EXPECT_INVALID(g.run(), "k must have at least one head when q has 8");
  Call u;
  u.varlen();
  u.lse = cuda_view(F32, {40, 8}, 0, addr(5));
  KF_EXPECT_INVALID(u.run(), "lse must have shape [8, 40] ([Hq, Tq] of q), got [40, 8]");
  u.lse = cuda_view(F32, {1, 8, 40}, 0, addr(5));
  KF_EXPECT_INVALID(u.run(), "lse must have 2 dimensions [Hq, Tq] (layout varlen), got 3 dimensions");
  Call s;
  s.sinks = cuda_view(F32, {4}, 0, addr(6));
  KF_EXPECT_INVALID(s.run(), "sinks must have shape [8] (one logit per query head), got [4]");
  s.sinks = cuda_view(F32, {1, 8}, 0, addr(6));
  KF_EXPECT_INVALID(s.run(), "sinks must have 1 dimension [Hq], got 2 dimensions");
}

TEST(AttentionValidation, HeadDims) {
  auto with_dims = [](int64_t dqk, int64_t dv) {
    Call c;
    c.q = cuda_view(BF16, {2, 16, 8, dqk}, 0, addr(1));
    c.k = cuda_view(BF16, {2, 32, 2, dqk}, 0, addr(2));
    c.v = cuda_view(BF16, {2, 32, 2, dv}, 0, addr(3));
    c.out = cuda_view(BF16, {2, 16, 8, dv}, 0, addr(4));
    return c;
  };
  for (int64_t d : {64, 96, 128, 256}) KF_EXPECT_VALID(with_dims(d, d).run());
  KF_EXPECT_VALID(with_dims(192, 128).run());
  const char* msg = "must be Dqk = Dv in {64, 96, 128, 256} or Dqk = 192 with Dv = 128";
  KF_EXPECT_INVALID(with_dims(80, 80).run(), "head dims (Dqk = 80 of q and k, Dv = 80 of v)", msg);
  KF_EXPECT_INVALID(with_dims(128, 64).run(), "head dims (Dqk = 128 of q and k, Dv = 64 of v)", msg);
  KF_EXPECT_INVALID(with_dims(512, 512).run(), "Dqk = 512", msg);
  KF_EXPECT_INVALID(with_dims(192, 192).run(), "Dqk = 192", msg);
  KF_EXPECT_INVALID(with_dims(256, 128).run_ref(), "Dqk = 256", msg);
}

TEST(AttentionValidation, Strides) {
  Call c;
  c.q.strides[3] = 2;
  KF_EXPECT_INVALID(c.run(), "q must be contiguous in its last dimension (stride 1), got stride 2");
  Call v;
  v.v.strides[1] = -256;
  KF_EXPECT_INVALID(v.run(), "v must not have negative strides, got [8192, -256, 128, 1]");
  Call l;
  l.lse.strides[2] = 8;
  KF_EXPECT_INVALID(l.run(), "lse must be contiguous in its last dimension (stride 1), got stride 8");
  Call s;
  s.sinks.strides[0] = 2;
  KF_EXPECT_INVALID(s.run(), "sinks must be contiguous in its last dimension (stride 1), got stride 2");
  Call n;
  n.k.data = nullptr;
  KF_EXPECT_INVALID(n.run(), "k has a null data pointer");
  Call f;  // a strided slice of a fused qkv buffer [2, 16, 12, 128] is valid
  const int64_t row = 12 * 128;
  for (TensorView* t : {&f.q, &f.k, &f.v}) {
    t->strides[0] = 16 * row;
    t->strides[1] = row;
  }
  f.k.shape[1] = f.v.shape[1] = 16;
  f.k.data = static_cast<char*>(f.q.data) + 8 * 128 * 2;
  f.v.data = static_cast<char*>(f.q.data) + 10 * 128 * 2;
  KF_EXPECT_VALID(f.run());
}

TEST(AttentionValidation, CuSeqlens) {
  Call c;
  c.has_cu = true;  // bshd
  KF_EXPECT_INVALID(c.run(), "cu_seqlens_q and cu_seqlens_k must be null unless the layout is varlen");
  Call v;
  v.varlen();
  v.has_cu = false;
  KF_EXPECT_INVALID(v.run(), "cu_seqlens_q and cu_seqlens_k are required with layout varlen (int32 [B + 1])");
  Call s;
  s.varlen();
  s.cuk = cuda_view(I32, {4}, 0, addr(8));
  KF_EXPECT_INVALID(s.run(), "cu_seqlens_k must have the shape of cu_seqlens_q [3] (B + 1), got [4]");
  s.cuk = cuda_view(I32, {3}, 0, addr(8));
  s.cuq = cuda_view(I32, {0}, 0, addr(7));
  KF_EXPECT_INVALID(s.run(), "cu_seqlens_q must have shape [B + 1] (at least one element), got [0]");
  s.cuq = cuda_view(I32, {3, 1}, 0, addr(7));
  KF_EXPECT_INVALID(s.run(), "cu_seqlens_q must have shape [B + 1]", "got [3, 1]");
  s.cuq = cuda_view(I32, {3}, 0, addr(7));
  s.cuq.strides[0] = 2;
  KF_EXPECT_INVALID(s.run(), "cu_seqlens_q must be contiguous (stride 1), got stride 2");
}

TEST(AttentionValidation, Options) {
  Call c;
  c.o.causal = true;
  c.o.window_right = 3;
  KF_EXPECT_INVALID(c.run(), "causal is window_right = 0; causal with window_right = 3 contradicts it");
  KF_EXPECT_INVALID(c.run_ref(), "causal with window_right = 3");
  Call w;
  w.o.window_left = -2;
  KF_EXPECT_INVALID(w.run(), "window_left must be -1 (unbounded) or >= 0, got -2");
  w.o.window_left = 0;
  w.o.window_right = -7;
  KF_EXPECT_INVALID(w.run(), "window_right must be -1 (unbounded) or >= 0, got -7");
  Call s;
  s.o.softcap = -1.0f;
  KF_EXPECT_INVALID(s.run(), "softcap must be finite and >= 0 (0: none), got -1");
  s.o.softcap = std::numeric_limits<float>::quiet_NaN();
  KF_EXPECT_INVALID(s.run(), "softcap must be finite and >= 0");
  s.o.softcap = std::numeric_limits<float>::infinity();
  KF_EXPECT_INVALID(s.run_ref(), "softcap must be finite and >= 0");
  Call sc;
  sc.o.scale = -0.125f;
  KF_EXPECT_INVALID(sc.run(), "scale must be finite and >= 0 (0: 1 / sqrt(Dqk)), got -0.125");
  sc.o.scale = std::numeric_limits<float>::infinity();
  KF_EXPECT_INVALID(sc.run(), "scale must be finite and >= 0");
  Call m;
  m.varlen();
  m.o.max_seqlen_k = -1;
  KF_EXPECT_INVALID(m.run(), "max_seqlen_q and max_seqlen_k must be >= 0 (0: the total token count), got 0 and -1");
  Call l;
  l.o.layout = static_cast<AttentionLayout>(7);
  KF_EXPECT_INVALID(l.run(), "layout must be AttentionLayout::kBSHD, kBHSD or kVarlen, got 7");
}

TEST(AttentionValidation, Aliasing) {
  Call c;
  c.out.data = static_cast<char*>(c.q.data) + 256;
  KF_EXPECT_INVALID(c.run(), "out must not overlap q (attention does not run in place)");
  Call k;
  k.out = k.k;
  k.out.shape[1] = 16, k.out.shape[2] = 8;  // shape of out, memory of k
  k.out.strides[0] = 16 * 8 * 128, k.out.strides[1] = 8 * 128;
  KF_EXPECT_INVALID(k.run(), "out must not overlap k");
  Call h;
  h.out.strides[2] = 0;  // every head at one address
  KF_EXPECT_INVALID(h.run(), "out has overlapping elements (shape [2, 16, 8, 128], strides [16384, 1024, 0, 1])");
  Call l;
  l.lse.data = static_cast<char*>(l.out.data) + 64;
  KF_EXPECT_INVALID(l.run(), "lse must not overlap out");
  l.lse.data = l.v.data;
  KF_EXPECT_INVALID(l.run(), "lse must not overlap v");
  Call r;  // q, k and v may overlap: they are read only
  r.k.data = r.v.data = r.q.data;
  KF_EXPECT_VALID(r.run());
}

TEST(AttentionValidation, Int32Limits) {
  Call c;
  const int64_t big = int64_t(1) << 31;
  c.q = cuda_view(BF16, {1, big, 1, 64}, 0, addr(1));
  c.out = cuda_view(BF16, {1, big, 1, 64}, 0, addr(10));
  c.k = c.v = cuda_view(BF16, {1, 4, 1, 64}, 0, addr(2));
  c.has_lse = c.has_sinks = false;
  KF_EXPECT_INVALID(c.run(), "Sq must be at most 2^31 - 1, got 2147483648");
  Call h;
  h.q = cuda_view(BF16, {1, 1, big, 64}, 0, addr(1));
  h.out = cuda_view(BF16, {1, 1, big, 64}, 0, addr(10));
  h.k = h.v = cuda_view(BF16, {1, 4, 1, 64}, 0, addr(2));
  h.has_lse = h.has_sinks = false;
  KF_EXPECT_INVALID(h.run(), "Hq must be at most 2^31 - 1");
}

// ---- what validation fills --------------------------------------------------------------------

TEST(AttentionValidation, ParamsDense) {
  Call c;
  kf::AttentionParams p;
  DType t;
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(t, BF16);
  EXPECT_EQ(p.q_sb, 16 * 8 * 128);
  EXPECT_EQ(p.q_ss, 8 * 128);
  EXPECT_EQ(p.q_sh, 128);
  EXPECT_EQ(p.k_sb, 32 * 2 * 128);
  EXPECT_EQ(p.k_ss, 2 * 128);
  EXPECT_EQ(p.k_sh, 128);
  EXPECT_EQ(p.lse_sb, 8 * 16);
  EXPECT_EQ(p.lse_sh, 16);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.heads_q, 8);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.group, 4);
  EXPECT_EQ(p.seqlen_q, 16);
  EXPECT_EQ(p.seqlen_k, 32);
  EXPECT_EQ(p.head_dim_qk, 128);
  EXPECT_EQ(p.head_dim_v, 128);
  EXPECT_FLOAT_EQ(p.scale, 1.0f / std::sqrt(128.0f));
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_TRUE(p.sinks_float);
  EXPECT_FALSE(p.varlen);
  EXPECT_EQ(p.cu_seqlens_q, nullptr);

  c.o.layout = AttentionLayout::kBHSD;  // q [2, 16, 8, 128] is now B 2, Hq 16, Sq 8
  c.k = c.v = cuda_view(BF16, {2, 4, 32, 128}, 0, addr(2));
  c.lse = cuda_view(F32, {2, 16, 8}, 0, addr(5));
  c.has_sinks = false;
  c.o.scale = 0.5f;
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.q_sb, 16 * 8 * 128);
  EXPECT_EQ(p.q_sh, 8 * 128);
  EXPECT_EQ(p.q_ss, 128);
  EXPECT_EQ(p.k_sh, 32 * 128);
  EXPECT_EQ(p.k_ss, 128);
  EXPECT_EQ(p.heads_q, 16);
  EXPECT_EQ(p.seqlen_q, 8);
  EXPECT_EQ(p.group, 4);
  EXPECT_EQ(p.scale, 0.5f);
  EXPECT_EQ(p.sinks, nullptr);

  // size-1 dimensions get stride 0 (any stride PyTorch gives them is never used)
  Call one;
  one.q = cuda_view(BF16, {1, 1, 8, 128}, 0, addr(1));
  one.out = cuda_view(BF16, {1, 1, 8, 128}, 0, addr(4));
  one.k = one.v = cuda_view(BF16, {1, 32, 2, 128}, 0, addr(2));
  one.lse = cuda_view(F32, {1, 8, 1}, 0, addr(5));
  one.q.strides[1] = 3;  // odd, and irrelevant
  KF_ASSERT_OK(one.params(&p, &t));
  EXPECT_EQ(p.q_sb, 0);
  EXPECT_EQ(p.q_ss, 0);
  EXPECT_EQ(p.q_sh, 128);
  EXPECT_EQ(p.k_sb, 0);
  EXPECT_TRUE(kf::make_attention_problem(p, t).tma_ok);
}

TEST(AttentionValidation, ParamsVarlen) {
  Call c;
  c.varlen();
  kf::AttentionParams p;
  DType t;
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_TRUE(p.varlen);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.q_sb, 0);
  EXPECT_EQ(p.q_ss, 8 * 128);
  EXPECT_EQ(p.q_sh, 128);
  EXPECT_EQ(p.lse_sb, 0);
  EXPECT_EQ(p.lse_sh, 40);
  EXPECT_EQ(p.seqlen_q, 40);
  EXPECT_EQ(p.seqlen_k, 50);  // no bound given: the totals
  EXPECT_EQ(p.cu_seqlens_q, c.cuq.data);
  c.o.max_seqlen_q = 25, c.o.max_seqlen_k = 60;  // 60 > Tk: the total bounds it better
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.seqlen_q, 25);
  EXPECT_EQ(p.seqlen_k, 50);
  const kf::AttentionProblem pr = kf::make_attention_problem(p, t);
  EXPECT_TRUE(pr.varlen);
  EXPECT_EQ(pr.total_q, 40);  // Tq, not the bound
}

TEST(AttentionValidation, MaskFolding) {
  kf::AttentionParams p;
  DType t;
  Call c;  // Sq 16, Sk 32
  c.o.causal = true;
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.window_right, 0);
  EXPECT_EQ(p.window_left, -1);
  kf::AttentionProblem pr = kf::make_attention_problem(p, t);
  EXPECT_TRUE(pr.causal);
  EXPECT_FALSE(pr.window);
  c.o.window_left = 30;  // row 15 sees j >= 15 + 16 - 30 = 1: key 0 is cut
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.window_left, 30);
  pr = kf::make_attention_problem(p, t);
  EXPECT_TRUE(pr.causal);
  EXPECT_TRUE(pr.window);
  c.o.window_left = 31;  // j >= i + 16 - 31 >= -15: every key, no window
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.window_left, -1);
  c.o.causal = false;
  c.o.window_right = 14;  // j <= i + 16 + 14 cuts the last keys of row 0
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.window_right, 14);
  pr = kf::make_attention_problem(p, t);
  EXPECT_FALSE(pr.causal);
  EXPECT_TRUE(pr.window);
  c.o.window_right = 15;  // j <= i + 31 holds for every key
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(p.window_right, -1);
  pr = kf::make_attention_problem(p, t);
  EXPECT_FALSE(pr.causal);
  EXPECT_FALSE(pr.window);
  Call d;  // causal decode (Sq = 1) sees every key: not causal
  d.q = cuda_view(BF16, {2, 1, 8, 128}, 0, addr(1));
  d.out = cuda_view(BF16, {2, 1, 8, 128}, 0, addr(4));
  d.lse = cuda_view(F32, {2, 8, 1}, 0, addr(5));
  d.o.causal = true;
  KF_ASSERT_OK(d.params(&p, &t));
  EXPECT_EQ(p.window_right, -1);
  EXPECT_FALSE(kf::make_attention_problem(p, t).causal);
}

TEST(AttentionValidation, Problem) {
  Call c;
  c.o.softcap = 50.0f;
  kf::AttentionParams p;
  DType t;
  KF_ASSERT_OK(c.params(&p, &t));
  kf::AttentionProblem pr = kf::make_attention_problem(p, t);
  EXPECT_EQ(pr.elem_bytes, 2);
  EXPECT_TRUE(pr.bf16);
  EXPECT_EQ(pr.batch, 2);
  EXPECT_EQ(pr.heads_q, 8);
  EXPECT_EQ(pr.heads_kv, 2);
  EXPECT_EQ(pr.seqlen_q, 16);
  EXPECT_EQ(pr.seqlen_k, 32);
  EXPECT_EQ(pr.total_q, 32);
  EXPECT_EQ(pr.head_dim_qk, 128);
  EXPECT_EQ(pr.head_dim_v, 128);
  EXPECT_TRUE(pr.softcap);
  EXPECT_TRUE(pr.sinks);
  EXPECT_TRUE(pr.lse);
  EXPECT_TRUE(pr.tma_ok);
  EXPECT_FALSE(pr.varlen);
  EXPECT_FALSE(pr.causal);
  EXPECT_FALSE(pr.window);

  Call u;  // a base 2 bytes off 16-byte alignment
  u.k.data = static_cast<char*>(u.k.data) + 2;
  u.has_lse = u.has_sinks = false;
  u.q.dtype = u.k.dtype = u.v.dtype = u.out.dtype = F16;
  KF_ASSERT_OK(u.params(&p, &t));
  pr = kf::make_attention_problem(p, t);
  EXPECT_FALSE(pr.tma_ok);
  EXPECT_FALSE(pr.bf16);
  EXPECT_FALSE(pr.lse);
  EXPECT_FALSE(pr.sinks);
  Call s;  // a row stride of 132 elements (264 bytes, not a multiple of 16)
  s.v.strides[1] = 2 * 132, s.v.strides[2] = 132, s.v.strides[0] = 32 * 2 * 132;
  KF_ASSERT_OK(s.params(&p, &t));
  EXPECT_FALSE(kf::make_attention_problem(p, t).tma_ok);
  s.v.strides[1] = 2 * 136, s.v.strides[2] = 136, s.v.strides[0] = 32 * 2 * 136;  // 272 bytes
  KF_ASSERT_OK(s.params(&p, &t));
  EXPECT_TRUE(kf::make_attention_problem(p, t).tma_ok);
}

// A valid call on real CPU tensors runs through the reference (float64, lse float64, sinks float32).
TEST(AttentionValidation, ValidCallOnCpu) {
  HostTensor q(F64, {1, 2, 2, 64}), k(F64, {1, 3, 1, 64}), v(F64, {1, 3, 1, 64}), out(F64, {1, 2, 2, 64}),
      lse(F64, {1, 2, 2}), sinks(F32, {2});
  for (HostTensor* x : {&q, &k, &v, &sinks})
    for (int64_t i = 0; i < x->numel(); ++i) x->set(i, 0.0);
  const TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = out.view(), lv = lse.view(), sv = sinks.view();
  AttentionTensors t;
  t.q = &qv, t.k = &kv, t.v = &vv, t.out = &ov, t.lse = &lv, t.sinks = &sv;
  KF_ASSERT_OK(ref::attention_forward(t, {}));
  EXPECT_NEAR(lse.get(0), std::log(4.0), 1e-15);  // three keys and a sink, all logits 0
  EXPECT_EQ(out.get(0), 0.0);
}

}  // namespace
