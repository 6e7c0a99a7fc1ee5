// The PyTorch binding of the RoPE family (include/kernelforge/rope.h): apply_rope, its backward and
// apply_rope_inplace. CUDA = our kernel, CPU = the float64 reference, Autograd = RopeFn below.
// Fake impls: python/kernelforge/rope.py.
// layout: "bshd" ([B, S, H, D]) or "bhsd" ([B, H, S, D]); rotary_dim 0 = cos.size(-1). k is optional:
// the second output is then an empty [0] tensor. cos/sin get no gradient (the autograd function
// refuses ones that require it).
#include <string>
#include <tuple>

#include "kernelforge/rope.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

constexpr EnumName<kf::RopeLayout> kLayouts[] = {{"bshd", kf::RopeLayout::kBSHD}, {"bhsd", kf::RopeLayout::kBHSD}};

kf::RopeOptions rope_options(const char* op, bool interleaved, c10::string_view layout, int64_t rotary_dim) {
  kf::RopeOptions o;
  o.layout = parse_enum(op, "layout", layout, kLayouts);
  o.interleaved = interleaved;
  o.rotary_dim = rotary_dim;
  return o;
}

void rope_run(bool cuda, bool backward, const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
              const OptTensor& pos, const kf::RopeOptions& o, const Tensor& q_out, const OptTensor& k_out) {
  const OptView kv(k), kov(k_out), pv(pos);
  if (cuda) {
    c10::cuda::CUDAGuard guard(q.device());
    check(backward ? kf::apply_rope_backward(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out),
                                             kov.get(), stream_of(q))
                   : kf::apply_rope(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out), kov.get(),
                                    stream_of(q)));
  } else {
    check(backward ? kf::ref::apply_rope_backward(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out),
                                                  kov.get())
                   : kf::ref::apply_rope(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out), kov.get()));
  }
}

// backward: the same rotation by -angle (dq_out, dk_out in place of q, k)
std::tuple<Tensor, Tensor> rope_impl(bool cuda, bool backward, const Tensor& q, const OptTensor& k, const Tensor& cos,
                                     const Tensor& sin, const OptTensor& pos, bool interleaved, c10::string_view layout,
                                     int64_t rotary_dim) {
  const char* op = backward ? "apply_rope_backward" : "apply_rope";
  const kf::RopeOptions o = rope_options(op, interleaved, layout, rotary_dim);
  if (cuda && needs_fallback(op, q)) {
    auto out = rope_impl(false, backward, q.cpu(), to_cpu(k), cos.cpu(), sin.cpu(), to_cpu(pos), interleaved, layout,
                         rotary_dim);
    return {std::get<0>(out).to(q.device()), std::get<1>(out).to(q.device())};
  }
  // Outputs keep their input's strides when it is dense (at::empty_like): HF hands over q as a
  // [B, H, S, D] view of [B, S, H, D] memory, and its own q * cos + ... keeps that layout too, so the
  // writes stay contiguous per token and the gradients match the leaf's strides (AccumulateGrad
  // would otherwise copy them). The fake impls (rope.py) follow the same rule.
  Tensor q_out = at::empty_like(q);
  const OptTensor k_out = defined(k) ? OptTensor(at::empty_like(*k)) : std::nullopt;
  rope_run(cuda, backward, q, k, cos, sin, pos, o, q_out, k_out);
  return {q_out, defined(k_out) ? *k_out : at::empty({0}, q.options())};
}

std::tuple<Tensor, Tensor> apply_rope_impl(bool cuda, const Tensor& q, const OptTensor& k, const Tensor& cos,
                                           const Tensor& sin, const OptTensor& pos, bool interleaved,
                                           c10::string_view layout, int64_t rotary_dim) {
  return rope_impl(cuda, false, q, k, cos, sin, pos, interleaved, layout, rotary_dim);
}

std::tuple<Tensor, Tensor> apply_rope_backward_impl(bool cuda, const Tensor& dq_out, const OptTensor& dk_out,
                                                    const Tensor& cos, const Tensor& sin, const OptTensor& pos,
                                                    bool interleaved, c10::string_view layout, int64_t rotary_dim) {
  return rope_impl(cuda, true, dq_out, dk_out, cos, sin, pos, interleaved, layout, rotary_dim);
}

void apply_rope_inplace_impl(bool cuda, const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                             const OptTensor& pos, bool interleaved, c10::string_view layout, int64_t rotary_dim) {
  const kf::RopeOptions o = rope_options("apply_rope_inplace", interleaved, layout, rotary_dim);
  if (cuda && needs_fallback("apply_rope_inplace", q)) {
    auto out =
        rope_impl(false, false, q.cpu(), to_cpu(k), cos.cpu(), sin.cpu(), to_cpu(pos), interleaved, layout, rotary_dim);
    q.copy_(std::get<0>(out));
    if (defined(k)) k->copy_(std::get<1>(out));
    return;
  }
  rope_run(cuda, false, q, k, cos, sin, pos, o, q, k);
}

using RopeSig = std::tuple<Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&, const Tensor&,
                                           const OptTensor&, bool, c10::string_view, int64_t);

class RopeFn : public torch::autograd::Function<RopeFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const OptTensor& k, const Tensor& cos,
                               const Tensor& sin, const OptTensor& pos, bool interleaved, c10::string_view layout,
                               int64_t rotary_dim) {
    TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(),
                "apply_rope: gradients with respect to cos and sin are not implemented; pass them detached");
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["rotary_dim"] = rotary_dim;
    ctx->saved_data["has_k"] = defined(k);
    ctx->save_for_backward({cos, sin, pos.value_or(Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<RopeSig>("kernelforge::apply_rope");
    auto [qo, ko] = op.call(q, k, cos, sin, pos, interleaved, layout, rotary_dim);
    if (!defined(k)) ctx->mark_non_differentiable({ko});
    return {qo, ko};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("apply_rope");
    auto saved = ctx->get_saved_variables();
    const OptTensor pos = saved_opt(saved[2]);
    const bool has_k = ctx->saved_data["has_k"].toBool();
    // an unused output has no gradient: zeros of its shape (the outputs are contiguous)
    const Tensor dq_out = grads[0].defined() ? dense(grads[0]) : Tensor();
    const Tensor dk_out = has_k && grads[1].defined() ? dense(grads[1]) : Tensor();
    if (!dq_out.defined() && !dk_out.defined()) return variable_list(8);
    static auto op = op_handle<RopeSig>("kernelforge::apply_rope_backward");
    const bool interleaved = ctx->saved_data["interleaved"].toBool();
    const std::string layout = ctx->saved_data["layout"].toStringRef();
    const int64_t rotary_dim = ctx->saved_data["rotary_dim"].toInt();
    variable_list out(8);
    if (dq_out.defined() && (dk_out.defined() || !has_k)) {
      auto [dq, dk] = op.call(dq_out, has_k ? OptTensor(dk_out) : std::nullopt, saved[0], saved[1], pos, interleaved,
                              layout, rotary_dim);
      out[0] = dq;
      if (has_k) out[1] = dk;
    } else if (dq_out.defined()) {  // k given but its output unused
      out[0] = std::get<0>(op.call(dq_out, std::nullopt, saved[0], saved[1], pos, interleaved, layout, rotary_dim));
    } else {  // only k's output used: run k as the "q" of the call
      out[1] = std::get<0>(op.call(dk_out, std::nullopt, saved[0], saved[1], pos, interleaved, layout, rotary_dim));
    }
    return out;
  }
};

std::tuple<Tensor, Tensor> apply_rope_autograd(const Tensor& q, const OptTensor& k, const Tensor& cos,
                                               const Tensor& sin, const OptTensor& pos, bool interleaved,
                                               c10::string_view layout, int64_t rotary_dim) {
  auto out = RopeFn::apply(q, k, cos, sin, pos, interleaved, layout, rotary_dim);
  return {out[0], out[1]};
}

}  // namespace

// apply_rope returns (q_out, k_out), k_out an empty [0] tensor without k; apply_rope_inplace rotates
// q and k in place (no autograd).
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&apply_rope_impl, &apply_rope_autograd>(
      m,
      "apply_rope(Tensor q, Tensor? k, Tensor cos, Tensor sin, Tensor? position_ids, bool interleaved, str layout, "
      "int rotary_dim) -> (Tensor, Tensor)");
  def_op<&apply_rope_backward_impl>(
      m,
      "apply_rope_backward(Tensor dq_out, Tensor? dk_out, Tensor cos, Tensor sin, Tensor? position_ids, "
      "bool interleaved, str layout, int rotary_dim) -> (Tensor, Tensor)");
  def_op<&apply_rope_inplace_impl>(
      m,
      "apply_rope_inplace(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, Tensor? position_ids, "
      "bool interleaved, str layout, int rotary_dim) -> ()");
}
