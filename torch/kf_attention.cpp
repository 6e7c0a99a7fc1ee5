// The PyTorch binding of the attention family (include/kernelforge/attention.h): the forward op
// kernelforge::attention and its backward kernelforge::attention_backward. CUDA = our kernels,
// CPU = the float64 reference, Autograd = AttentionFn below (the forward with lse, then the backward
// op). Fake impls: python/kernelforge/attention.py.
//
// layout "bshd": q [B, Sq, Hq, Dqk], out [B, Sq, Hq, Dv]; "bhsd": q [B, Hq, Sq, Dqk], out [B, Hq, Sq, Dv];
// "varlen": q [Tq, Hq, Dqk] packed by cu_seqlens_q / cu_seqlens_k (int32 [B + 1]), out [Tq, Hq, Dv].
// out is contiguous in q's layout. lse (return_lse): float32 [B, Hq, Sq] or [Hq, Tq]; otherwise an
// empty float32 [0] tensor (the schema keeps two outputs). lse carries no gradient. scale None:
// 1 / sqrt(Dqk). causal is bottom-right aligned; window_left / window_right -1: unbounded.
// max_seqlen_q / _k (varlen only): upper bounds of the sequence lengths, 0 = the token count; SymInt
// so that torch.compile does not specialize on them (the fake impls read neither: new lengths trace
// nothing new). deterministic: read by the backward only (dq and dsinks summed in a fixed order).
//
// attention_backward: dq, dk, dv with the shapes and dtypes of q, k, v (torch.empty_like: q's
// strides when q is dense, else contiguous), dsinks float32 [Hq] (an empty float32 [0] tensor
// without sinks). lse is the forward's float32 logsumexp.
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/attention.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

constexpr EnumName<kf::AttentionLayout> kLayouts[] = {{"bshd", kf::AttentionLayout::kBSHD},
                                                      {"bhsd", kf::AttentionLayout::kBHSD},
                                                      {"varlen", kf::AttentionLayout::kVarlen}};

// The output shapes, read from q and v before the core validates them: a tensor of the wrong rank
// is refused here with the layout's expected shape (everything else is checked by the core).
struct OutShapes {
  std::vector<int64_t> out, lse;
};

OutShapes out_shapes(kf::AttentionLayout layout, const Tensor& q, const Tensor& v) {
  const bool varlen = layout == kf::AttentionLayout::kVarlen;
  const int64_t rank = varlen ? 3 : 4;
  const char* form = varlen ? "[Tq, Hq, D] for layout 'varlen'"
                            : (layout == kf::AttentionLayout::kBSHD ? "[B, Sq, Hq, D] for layout 'bshd'"
                                                                    : "[B, Hq, Sq, D] for layout 'bhsd'");
  // Messages are formatted into one std::string here: TORCH_CHECK_VALUE with numeric arguments
  // crashed (SIGSEGV) when built with GCC 13 against torch 2.11 on the H100 machine.
  if (q.dim() != rank)
    TORCH_CHECK_VALUE(false, "attention: q must have " + std::to_string(rank) + " dimensions " + form + ", got " +
                                 std::to_string(q.dim()));
  if (v.dim() != rank)
    TORCH_CHECK_VALUE(false, "attention: v must have " + std::to_string(rank) + " dimensions (q's layout), got " +
                                 std::to_string(v.dim()));
  OutShapes s;
  s.out = q.sizes().vec();
  s.out.back() = v.size(-1);
  if (varlen)
    s.lse = {q.size(1), q.size(0)};
  else if (layout == kf::AttentionLayout::kBSHD)
    s.lse = {q.size(0), q.size(2), q.size(1)};
  else
    s.lse = {q.size(0), q.size(1), q.size(2)};
  return s;
}

kf::AttentionOptions make_options(c10::string_view layout, bool causal, std::optional<double> scale,
                                  int64_t window_left, int64_t window_right, double softcap, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, bool deterministic) {
  kf::AttentionOptions o;
  o.layout = parse_enum("attention", "layout", layout, kLayouts);
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = static_cast<float>(softcap);
  // scale 0 is the core's "1 / sqrt(Dqk)"; an explicit 0 (or a negative value) is no softmax scale
  if (scale.has_value() && !(std::isfinite(*scale) && *scale > 0.0))
    TORCH_CHECK_VALUE(false, "attention: scale must be a finite value > 0 or None (1 / sqrt(head dim)), got " +
                                 std::to_string(*scale));
  o.scale = scale.has_value() ? static_cast<float>(*scale) : 0.0f;
  o.max_seqlen_q = max_seqlen_q;
  o.max_seqlen_k = max_seqlen_k;
  o.deterministic = deterministic;
  return o;
}

std::tuple<Tensor, Tensor> attention_impl(bool cuda, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                          std::optional<double> scale, int64_t window_left, int64_t window_right,
                                          double softcap, const OptTensor& sinks, const OptTensor& cu_seqlens_q,
                                          const OptTensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                          c10::string_view layout, bool return_lse, bool deterministic) {
  const kf::AttentionOptions o = make_options(layout, causal, scale, window_left, window_right, softcap, max_seqlen_q,
                                              max_seqlen_k, deterministic);
  if (cuda && needs_fallback("attention", q)) {
    auto res = attention_impl(false, q.cpu(), k.cpu(), v.cpu(), causal, scale, window_left, window_right, softcap,
                              to_cpu(sinks), to_cpu(cu_seqlens_q), to_cpu(cu_seqlens_k), max_seqlen_q, max_seqlen_k,
                              layout, return_lse, deterministic);
    return {std::get<0>(res).to(q.device()), std::get<1>(res).to(q.device())};
  }
  const OutShapes shapes = out_shapes(o.layout, q, v);
  Tensor out = at::empty(shapes.out, q.options());
  Tensor lse = at::empty(return_lse ? shapes.lse : std::vector<int64_t>{0}, q.options().dtype(at::kFloat));

  const kf::TensorView qv = view(q), kv = view(k), vv = view(v), ov = view(out), lv = view(lse);
  const OptView sv(sinks), cqv(cu_seqlens_q), ckv(cu_seqlens_k);
  kf::AttentionTensors t;
  t.q = &qv;
  t.k = &kv;
  t.v = &vv;
  t.out = &ov;
  t.lse = return_lse ? &lv : nullptr;
  t.sinks = sv.get();
  t.cu_seqlens_q = cqv.get();
  t.cu_seqlens_k = ckv.get();
  if (!cuda) {
    check(kf::ref::attention_forward(t, o));
    return {out, lse};
  }
  c10::cuda::CUDAGuard guard(q.device());
  // Plan (host only), then a workspace from the caching allocator when the plan needs one (split-KV):
  // no host synchronization, stream-ordered on the current stream.
  kf::AttentionPlan plan;
  size_t bytes = 0;
  check(kf::attention_plan(t, o, &plan, &bytes));
  Tensor ws = bytes > 0 ? workspace(q, bytes) : Tensor();
  check(kf::attention_forward(plan, t, o, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream_of(q)));
  return {out, lse};
}

using AttentionGrads = std::tuple<Tensor, Tensor, Tensor, Tensor>;  // dq, dk, dv, dsinks

AttentionGrads attention_backward_impl(bool cuda, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, bool causal, std::optional<double> scale,
                                       int64_t window_left, int64_t window_right, double softcap,
                                       const OptTensor& sinks, const OptTensor& cu_seqlens_q,
                                       const OptTensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                       c10::string_view layout, bool deterministic) {
  const kf::AttentionOptions o = make_options(layout, causal, scale, window_left, window_right, softcap, max_seqlen_q,
                                              max_seqlen_k, deterministic);
  if (cuda && needs_fallback("attention_backward", q)) {
    auto res = attention_backward_impl(false, dout.cpu(), q.cpu(), k.cpu(), v.cpu(), out.cpu(), lse.cpu(), causal,
                                       scale, window_left, window_right, softcap, to_cpu(sinks), to_cpu(cu_seqlens_q),
                                       to_cpu(cu_seqlens_k), max_seqlen_q, max_seqlen_k, layout, deterministic);
    const auto dev = q.device();
    return {std::get<0>(res).to(dev), std::get<1>(res).to(dev), std::get<2>(res).to(dev), std::get<3>(res).to(dev)};
  }
  out_shapes(o.layout, q, v);  // the ranks, with the layout's expected shape in the message
  // Gradients in their inputs' memory layout where those are dense (a bhsd view of bshd memory keeps
  // its bshd strides), contiguous otherwise (e.g. slices of a fused qkv projection).
  Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const std::vector<int64_t> dsinks_shape = defined(sinks) ? sinks->sizes().vec() : std::vector<int64_t>{0};
  Tensor dsinks = at::empty(dsinks_shape, q.options().dtype(at::kFloat));

  const kf::TensorView qv = view(q), kv = view(k), vv = view(v), ov = view(out), lv = view(lse), dov = view(dout);
  const kf::TensorView dqv = view(dq), dkv = view(dk), dvv = view(dv), dsv = view(dsinks);
  const OptView sv(sinks), cqv(cu_seqlens_q), ckv(cu_seqlens_k);
  kf::AttentionGradTensors t;
  t.fwd.q = &qv;
  t.fwd.k = &kv;
  t.fwd.v = &vv;
  t.fwd.out = &ov;
  t.fwd.lse = &lv;
  t.fwd.sinks = sv.get();
  t.fwd.cu_seqlens_q = cqv.get();
  t.fwd.cu_seqlens_k = ckv.get();
  t.dout = &dov;
  t.dq = &dqv;
  t.dk = &dkv;
  t.dv = &dvv;
  t.dsinks = sv.present ? &dsv : nullptr;
  if (!cuda) {
    check(kf::ref::attention_backward(t, o));
    return {dq, dk, dv, dsinks};
  }
  c10::cuda::CUDAGuard guard(q.device());
  // As the forward: plan on the host, the workspace (float32 dq accumulator, row sums D) from the
  // caching allocator, stream-ordered on the current stream.
  kf::AttentionPlan plan;
  size_t bytes = 0;
  check(kf::attention_backward_plan(t, o, &plan, &bytes));
  Tensor ws = bytes > 0 ? workspace(q, bytes) : Tensor();
  check(kf::attention_backward(plan, t, o, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream_of(q)));
  return {dq, dk, dv, dsinks};
}

// The Autograd kernels see the SymInt max_seqlen of a torch.compile trace as they are (the CUDA and
// CPU kernels take them as int64_t: they only ever run on concrete values).
using AttentionSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                                std::optional<double>, int64_t, int64_t, double, const OptTensor&,
                                                const OptTensor&, const OptTensor&, c10::SymInt, c10::SymInt,
                                                c10::string_view, bool, bool);
using AttentionBackwardSig = AttentionGrads(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, bool, std::optional<double>, int64_t, int64_t, double,
                                            const OptTensor&, const OptTensor&, const OptTensor&, c10::SymInt,
                                            c10::SymInt, c10::string_view, bool);

// The forward always computes lse here (the backward needs it) and saves q, k, v, out, lse, sinks and
// cu_seqlens; the backward op gives dq, dk, dv and dsinks (float32, returned in sinks' dtype).
// lse is an output without a gradient: it is marked non-differentiable (a loss through lse alone is
// an error "does not require grad", never a silently dropped term).
class AttentionFn : public torch::autograd::Function<AttentionFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const OptTensor& sinks, bool causal, std::optional<double> scale, int64_t window_left,
                               int64_t window_right, double softcap, const OptTensor& cu_seqlens_q,
                               const OptTensor& cu_seqlens_k, c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
                               c10::string_view layout, bool deterministic) {
    Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      static auto op = op_handle<AttentionSig>("kernelforge::attention");
      std::tie(out, lse) = op.call(q, k, v, causal, scale, window_left, window_right, softcap, sinks, cu_seqlens_q,
                                   cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, true, deterministic);
    }
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["max_seqlen_q"] = max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = max_seqlen_k;
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["deterministic"] = deterministic;
    ctx->save_for_backward({q, k, v, out, lse, sinks.value_or(Tensor()), cu_seqlens_q.value_or(Tensor()),
                            cu_seqlens_k.value_or(Tensor())});
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("attention");
    auto s = ctx->get_saved_variables();
    const OptTensor sinks = saved_opt(s[5]);
    auto& d = ctx->saved_data;
    const std::optional<double> scale =
        d["scale"].isNone() ? std::nullopt : std::optional<double>(d["scale"].toDouble());
    static auto op = op_handle<AttentionBackwardSig>("kernelforge::attention_backward");
    auto [dq, dk, dv, dsinks] =
        op.call(dense(grads[0]), s[0], s[1], s[2], s[3], s[4], d["causal"].toBool(), scale, d["window_left"].toInt(),
                d["window_right"].toInt(), d["softcap"].toDouble(), sinks, saved_opt(s[6]), saved_opt(s[7]),
                d["max_seqlen_q"].toSymInt(), d["max_seqlen_k"].toSymInt(), d["layout"].toStringRef(),
                d["deterministic"].toBool());
    // dsinks: one float32 sum per head, returned in sinks' dtype (float32 or q's)
    const Tensor dsinks_out = sinks.has_value() ? dsinks.to(sinks->scalar_type()) : Tensor();
    // q, k, v, sinks, then no gradient for the options and cu_seqlens (11 arguments)
    variable_list res = {dq, dk, dv, dsinks_out};
    res.resize(15);
    return res;
  }
};

// Without a gradient to record (no_grad / inference, or no input requiring one) the op goes straight
// to the kernel: no autograd Function, context or saved tensor.
std::tuple<Tensor, Tensor> attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                              std::optional<double> scale, int64_t window_left, int64_t window_right,
                                              double softcap, const OptTensor& sinks, const OptTensor& cu_seqlens_q,
                                              const OptTensor& cu_seqlens_k, c10::SymInt max_seqlen_q,
                                              c10::SymInt max_seqlen_k, c10::string_view layout, bool return_lse,
                                              bool deterministic) {
  const bool wants_grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                                                         (defined(sinks) && sinks->requires_grad()));
  if (!wants_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<AttentionSig>("kernelforge::attention");
    return op.call(q, k, v, causal, scale, window_left, window_right, softcap, sinks, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, layout, return_lse, deterministic);
  }
  variable_list res = AttentionFn::apply(q, k, v, sinks, causal, scale, window_left, window_right, softcap,
                                         cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, deterministic);
  return {res[0], return_lse ? res[1] : res[1].new_empty({0})};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&attention_impl, &attention_autograd>(
      m,
      "attention(Tensor q, Tensor k, Tensor v, *, bool causal, float? scale, int window_left, int window_right, "
      "float softcap, Tensor? sinks, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, "
      "SymInt max_seqlen_k, str layout, bool return_lse, bool deterministic=False) -> (Tensor out, Tensor lse)");
  def_op<&attention_backward_impl>(
      m,
      "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, bool causal, "
      "float? scale, int window_left, int window_right, float softcap, Tensor? sinks, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, str layout, bool deterministic) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)");
}
