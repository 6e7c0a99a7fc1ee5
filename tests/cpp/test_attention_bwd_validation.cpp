// Argument validation of the attention backward: a bad call returns kInvalidArgument with a message
// that names the entry, the argument and what was expected, and nothing is launched. The views point
// at dummy addresses never dereferenced (the CUDA calls are size queries, which launch nothing);
// the CPU reference runs the same checks. The last tests read the params and the problem that
// validation fills.
#include <string>

#include "attention/attention_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::AttentionGradTensors;
using kernelforge::AttentionLayout;
using kernelforge::AttentionOptions;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType F64 = DType::kFloat64;
constexpr DType I32 = DType::kInt32;

uintptr_t addr(int i) { return uintptr_t(i) << 36; }  // distinct, far-apart, 16-byte aligned dummy addresses

// A valid GQA backward call, bshd: q [2, 16, 8, 128], k / v [2, 32, 2, 128], out / dout
// [2, 16, 8, 128], lse [2, 8, 16], sinks / dsinks [8] (float32), dq / dk / dv like q / k / v.
struct Call {
  TensorView q = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(1));
  TensorView k = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(2));
  TensorView v = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(3));
  TensorView out = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(4));
  TensorView lse = cuda_view(F32, {2, 8, 16}, 0, addr(5));
  TensorView sinks = cuda_view(F32, {8}, 0, addr(6));
  TensorView cuq = cuda_view(I32, {3}, 0, addr(7));
  TensorView cuk = cuda_view(I32, {3}, 0, addr(8));
  TensorView dout = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(9));
  TensorView dq = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(10));
  TensorView dk = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(11));
  TensorView dv = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(12));
  TensorView dsinks = cuda_view(F32, {8}, 0, addr(13));
  bool has_lse = true, has_sinks = true, has_dsinks = true, has_cu = false;
  AttentionOptions o;

  void varlen() {
    o.layout = AttentionLayout::kVarlen;
    q = cuda_view(BF16, {40, 8, 128}, 0, addr(1));
    k = cuda_view(BF16, {50, 2, 128}, 0, addr(2));
    v = cuda_view(BF16, {50, 2, 128}, 0, addr(3));
    out = cuda_view(BF16, {40, 8, 128}, 0, addr(4));
    lse = cuda_view(F32, {8, 40}, 0, addr(5));
    dout = cuda_view(BF16, {40, 8, 128}, 0, addr(9));
    dq = cuda_view(BF16, {40, 8, 128}, 0, addr(10));
    dk = cuda_view(BF16, {50, 2, 128}, 0, addr(11));
    dv = cuda_view(BF16, {50, 2, 128}, 0, addr(12));
    has_cu = true;
  }
  AttentionGradTensors tensors() const {
    AttentionGradTensors t;
    t.fwd.q = &q, t.fwd.k = &k, t.fwd.v = &v, t.fwd.out = &out;
    t.fwd.lse = has_lse ? &lse : nullptr;
    t.fwd.sinks = has_sinks ? &sinks : nullptr;
    t.fwd.cu_seqlens_q = has_cu ? &cuq : nullptr;
    t.fwd.cu_seqlens_k = has_cu ? &cuk : nullptr;
    t.dout = &dout, t.dq = &dq, t.dk = &dk, t.dv = &dv;
    t.dsinks = has_dsinks ? &dsinks : nullptr;
    return t;
  }
  // The one-call CUDA entry as a size query (validates, launches nothing).
  Status run() const {
    size_t bytes = 0;
    return kf::attention_backward(tensors(), o, nullptr, &bytes, nullptr);
  }
  Status plan() const {
    kf::AttentionPlan p;
    size_t bytes = 0;
    return kf::attention_backward_plan(tensors(), o, &p, &bytes);
  }
  // The CPU reference on the same views moved to the CPU (an invalid call never reads them).
  Status run_ref() const {
    Call c = *this;
    for (TensorView* t :
         {&c.q, &c.k, &c.v, &c.out, &c.lse, &c.sinks, &c.cuq, &c.cuk, &c.dout, &c.dq, &c.dk, &c.dv, &c.dsinks})
      t->device = Device{DeviceType::kCPU, 0};
    return ref::attention_backward(c.tensors(), c.o);
  }
  Status params(kf::AttentionGradParams* p, DType* t) const {
    kf::AttentionGradCall c;
    c.t = tensors();
    c.opts = o;
    return kf::validate_attention_backward(c, p, t);
  }
};

// A call that validates: Ok where a GPU is present (a size query), a device error where none is.
#define KF_EXPECT_VALID(status_expr)                                                     \
  do {                                                                                   \
    const ::kernelforge::Status _st = (status_expr);                                     \
    EXPECT_NE(_st.code(), ::kernelforge::StatusCode::kInvalidArgument) << _st.message(); \
  } while (0)

TEST(AttentionBwdValidation, ValidCallsPass) {
  Call c;
  KF_EXPECT_VALID(c.run());
  KF_EXPECT_VALID(c.plan());
  Call v;
  v.varlen();
  KF_EXPECT_VALID(v.run());
  Call n;  // no sinks, no dsinks
  n.has_sinks = n.has_dsinks = false;
  KF_EXPECT_VALID(n.run());
  kf::AttentionGradParams p;
  DType t;
  KF_EXPECT_VALID(c.params(&p, &t));
}

TEST(AttentionBwdValidation, NullTensors) {
  Call c;
  c.has_lse = false;
  KF_EXPECT_INVALID(c.run(), "attention_backward: lse must not be null: the backward needs the forward's logsumexp");
  KF_EXPECT_INVALID(c.run_ref(), "attention_backward: lse must not be null", "float32/float64 [B, Hq, Sq]");
  KF_EXPECT_INVALID(c.plan(), "attention_backward_plan: lse must not be null");
  Call ok;
  AttentionGradTensors t = ok.tensors();
  size_t bytes = 0;
  t.fwd.q = nullptr;
  KF_EXPECT_INVALID(kf::attention_backward(t, ok.o, nullptr, &bytes, nullptr),
                    "attention_backward: q must not be null");
  t = ok.tensors(), t.dout = nullptr;
  KF_EXPECT_INVALID(kf::attention_backward(t, ok.o, nullptr, &bytes, nullptr), "dout must not be null");
  t = ok.tensors(), t.dq = nullptr;
  KF_EXPECT_INVALID(kf::attention_backward(t, ok.o, nullptr, &bytes, nullptr), "dq must not be null");
  t = ok.tensors(), t.dk = nullptr;
  KF_EXPECT_INVALID(kf::attention_backward(t, ok.o, nullptr, &bytes, nullptr), "dk must not be null");
  t = ok.tensors(), t.dv = nullptr;
  KF_EXPECT_INVALID(kf::attention_backward(t, ok.o, nullptr, &bytes, nullptr), "dv must not be null");
  KF_EXPECT_INVALID(kf::attention_backward(ok.tensors(), ok.o, nullptr, nullptr, nullptr),
                    "attention_backward: workspace_bytes must not be null");
  kf::AttentionPlan p;
  KF_EXPECT_INVALID(kf::attention_backward_plan(ok.tensors(), ok.o, &p, nullptr),
                    "attention_backward_plan: plan and workspace_bytes must not be null");
}

TEST(AttentionBwdValidation, ForwardChecksApply) {
  Call c;
  c.k.dtype = F16;
  KF_EXPECT_INVALID(c.run(), "attention_backward: k must have the dtype of q (bfloat16), got float16");
  Call w;
  w.o.window_left = -2;
  KF_EXPECT_INVALID(w.run(), "window_left must be -1 (unbounded) or >= 0, got -2");
  Call l;
  l.lse = cuda_view(F32, {2, 8, 15}, 0, addr(5));
  KF_EXPECT_INVALID(l.run(), "lse must have shape [2, 8, 16]");
}

TEST(AttentionBwdValidation, DoutAndGradientShapesAndDtypes) {
  Call c;
  c.dout = cuda_view(BF16, {2, 16, 8, 64}, 0, addr(9));
  KF_EXPECT_INVALID(c.run(), "dout must have shape [2, 16, 8, 128] (the shape of out), got [2, 16, 8, 64]");
  Call d;
  d.dout.dtype = F16;
  KF_EXPECT_INVALID(d.run(), "dout must have the dtype of q (bfloat16), got float16");
  KF_EXPECT_INVALID(d.run_ref(), "dout must have the dtype of q (bfloat16), got float16");
  Call q;
  q.dq = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(10));
  KF_EXPECT_INVALID(q.run(), "dq must have shape [2, 16, 8, 128] (the shape of q), got [2, 32, 2, 128]");
  Call k;
  k.dk.dtype = F32;
  KF_EXPECT_INVALID(k.run(), "dk must have the dtype of q (bfloat16), got float32");
  Call v;
  v.dv = cuda_view(BF16, {2, 32, 128}, 0, addr(12));
  KF_EXPECT_INVALID(v.run(), "dv must have 4 dimensions", "got 3 dimensions [2, 32, 128]");
  Call r;
  r.dq.strides[3] = 2;
  KF_EXPECT_INVALID(r.run(), "dq must be contiguous in its last dimension (stride 1), got stride 2");
  Call g;
  g.dk.device.index = 1;
  KF_EXPECT_INVALID(g.run(), "dk must be on the same device as q (cuda:0), got cuda:1");
  Call u;
  u.dout.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(u.run(), "dout must be on the same device as q (cuda:0), got cpu");
  Call n;
  n.dv.data = nullptr;
  KF_EXPECT_INVALID(n.run(), "dv has a null data pointer");
}

TEST(AttentionBwdValidation, Dsinks) {
  Call m;
  m.has_dsinks = false;
  KF_EXPECT_INVALID(m.run(), "dsinks must not be null when sinks is given (float32 [8])");
  Call x;
  x.has_sinks = false;
  KF_EXPECT_INVALID(x.run(), "dsinks must be null when sinks is not given");
  KF_EXPECT_INVALID(x.run_ref(), "dsinks must be null when sinks is not given");
  Call s;
  s.dsinks = cuda_view(F32, {4}, 0, addr(13));
  KF_EXPECT_INVALID(s.run(), "dsinks must have shape [8] (one gradient per query head, like sinks), got [4]");
  Call r;
  r.dsinks = cuda_view(F32, {8, 1}, 0, addr(13));
  KF_EXPECT_INVALID(r.run(), "dsinks must have 1 dimension [Hq], got 2 dimensions [8, 1]");
  Call t;
  t.dsinks.dtype = BF16;
  KF_EXPECT_INVALID(t.run(), "dsinks must be a float32 tensor, got bfloat16");
  KF_EXPECT_INVALID(t.run_ref(), "dsinks must be a float32/float64 tensor, got bfloat16");
  t.dsinks.dtype = F64;  // the reference accepts float64
  KF_EXPECT_INVALID(t.run(), "dsinks must be a float32 tensor, got float64");
  Call dv;
  dv.dsinks.device.index = 3;
  KF_EXPECT_INVALID(dv.run(), "dsinks must be on the same device as q (cuda:0), got cuda:3");
}

TEST(AttentionBwdValidation, Overlaps) {
  Call a;
  a.dq.data = a.q.data;
  KF_EXPECT_INVALID(a.run(), "dq must not overlap q (the backward does not run in place)");
  Call b;
  b.dv.data = b.dk.data;
  KF_EXPECT_INVALID(b.run(), "dv must not overlap dk");
  Call c;
  c.dk.data = c.dout.data;
  KF_EXPECT_INVALID(c.run(), "dk must not overlap dout");
  Call d;
  d.dq.data = d.lse.data;
  KF_EXPECT_INVALID(d.run(), "dq must not overlap lse");
  Call e;
  e.dsinks.data = e.sinks.data;
  KF_EXPECT_INVALID(e.run(), "dsinks must not overlap sinks");
  Call f;
  f.dsinks.data = static_cast<char*>(f.dq.data) + 64;
  KF_EXPECT_INVALID(f.run(), "dsinks must not overlap dq");
  Call g;
  g.dv.data = g.out.data;
  KF_EXPECT_INVALID(g.run(), "dv must not overlap out");
  Call s;  // a broadcast (stride 0) gradient: elements alias each other
  s.dq.strides[1] = 0;
  KF_EXPECT_INVALID(s.run(), "dq has overlapping elements (shape [2, 16, 8, 128], strides [16384, 0, 128, 1])");
  // dq / dk / dv as head slices of one fused [2, 16, 12, 128] buffer: disjoint, valid
  Call fused;
  fused.k = cuda_view(BF16, {2, 16, 2, 128}, 0, addr(2));
  fused.v = cuda_view(BF16, {2, 16, 2, 128}, 0, addr(3));
  const TensorView buf = cuda_view(BF16, {2, 16, 12, 128}, 0, addr(10));
  auto heads = [&](int64_t h0, int64_t H) {
    TensorView x = buf;
    x.data = static_cast<char*>(x.data) + h0 * 128 * 2;
    x.shape[2] = H;
    return x;
  };
  fused.dq = heads(0, 8), fused.dk = heads(8, 2), fused.dv = heads(10, 2);
  KF_EXPECT_VALID(fused.run());
  fused.dv = heads(9, 2);  // heads 9, 10: head 9 is dk's
  KF_EXPECT_INVALID(fused.run(), "dv must not overlap dk");
  fused.dv = heads(10, 2);
  fused.dk.data = static_cast<char*>(fused.dk.data) + 2;  // one element off: rows interleave
  KF_EXPECT_INVALID(fused.run(), "dk must not overlap dq");
}

// The params: strides with the size-1 convention (0), varlen batch strides 0, deterministic from the
// options; the problem: total_k, deterministic, and tma_ok covering dout and the gradients.
TEST(AttentionBwdValidation, ParamsAndProblem) {
  Call c;
  c.o.deterministic = true;
  c.dk = cuda_view(BF16, {2, 32, 2, 128}, 0, addr(11));
  c.dk.strides[0] = 32 * 2 * 136, c.dk.strides[1] = 2 * 136, c.dk.strides[2] = 136;  // padded rows
  kf::AttentionGradParams p;
  DType t;
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_EQ(t, BF16);
  EXPECT_EQ(p.f.lse, c.lse.data);
  EXPECT_EQ(p.dout, c.dout.data);
  EXPECT_EQ(p.dq, c.dq.data);
  EXPECT_EQ(p.dk, c.dk.data);
  EXPECT_EQ(p.dv, c.dv.data);
  EXPECT_EQ(static_cast<void*>(p.dsinks), c.dsinks.data);
  EXPECT_EQ(p.do_sb, 16 * 8 * 128);
  EXPECT_EQ(p.do_ss, 8 * 128);
  EXPECT_EQ(p.do_sh, 128);
  EXPECT_EQ(p.dq_sb, 16 * 8 * 128);
  EXPECT_EQ(p.dq_ss, 8 * 128);
  EXPECT_EQ(p.dq_sh, 128);
  EXPECT_EQ(p.dk_sb, 32 * 2 * 136);
  EXPECT_EQ(p.dk_ss, 2 * 136);
  EXPECT_EQ(p.dk_sh, 136);
  EXPECT_EQ(p.dv_sb, 32 * 2 * 128);
  EXPECT_EQ(p.dv_ss, 2 * 128);
  EXPECT_EQ(p.dv_sh, 128);
  EXPECT_TRUE(p.deterministic);
  kf::AttentionProblem pr = kf::make_attention_bwd_problem(p, t);
  EXPECT_EQ(pr.total_q, 2 * 16);
  EXPECT_EQ(pr.total_k, 2 * 32);
  EXPECT_TRUE(pr.deterministic);
  EXPECT_TRUE(pr.lse);
  EXPECT_TRUE(pr.sinks);
  EXPECT_TRUE(pr.tma_ok);
  c.o.deterministic = false;
  KF_ASSERT_OK(c.params(&p, &t));
  EXPECT_FALSE(p.deterministic);
  EXPECT_FALSE(kf::make_attention_bwd_problem(p, t).deterministic);

  // one gradient off 16-byte alignment: no TMA; the same for an odd row stride of dout
  Call a;
  a.dv.data = static_cast<char*>(a.dv.data) + 2;
  KF_ASSERT_OK(a.params(&p, &t));
  EXPECT_FALSE(kf::make_attention_bwd_problem(p, t).tma_ok);
  Call o;
  o.dout = cuda_view(BF16, {2, 16, 8, 128}, 0, addr(9));
  o.dout.strides[2] = 129, o.dout.strides[1] = 8 * 129, o.dout.strides[0] = 16 * 8 * 129;
  KF_ASSERT_OK(o.params(&p, &t));
  EXPECT_FALSE(kf::make_attention_bwd_problem(p, t).tma_ok);

  // size-1 dimensions get stride 0; varlen has no batch stride
  Call s;
  s.q = cuda_view(BF16, {1, 16, 8, 128}, 0, addr(1));
  s.k = s.v = cuda_view(BF16, {1, 32, 2, 128}, 0, addr(2));
  s.out = cuda_view(BF16, {1, 16, 8, 128}, 0, addr(4));
  s.lse = cuda_view(F32, {1, 8, 16}, 0, addr(5));
  s.dout = cuda_view(BF16, {1, 16, 8, 128}, 0, addr(9));
  s.dq = cuda_view(BF16, {1, 16, 8, 128}, 0, addr(10));
  s.dk = cuda_view(BF16, {1, 32, 2, 128}, 0, addr(11));
  s.dv = cuda_view(BF16, {1, 32, 2, 128}, 0, addr(12));
  KF_ASSERT_OK(s.params(&p, &t));
  EXPECT_EQ(p.do_sb, 0);
  EXPECT_EQ(p.dq_sb, 0);
  EXPECT_EQ(p.dk_sb, 0);
  EXPECT_EQ(p.dv_sb, 0);
  Call v;
  v.varlen();
  KF_ASSERT_OK(v.params(&p, &t));
  EXPECT_EQ(p.do_sb, 0);
  EXPECT_EQ(p.dq_sb, 0);
  EXPECT_EQ(p.dk_sb, 0);
  EXPECT_EQ(p.dv_sb, 0);
  EXPECT_EQ(p.dq_ss, 8 * 128);
  EXPECT_EQ(p.dk_ss, 2 * 128);
  EXPECT_EQ(p.dk_sh, 128);
  pr = kf::make_attention_bwd_problem(p, t);
  EXPECT_EQ(pr.total_q, 40);
  EXPECT_EQ(pr.total_k, 50);
}

}  // namespace
