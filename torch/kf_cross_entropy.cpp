// PyTorch binding of the cross-entropy family: kernelforge::cross_entropy (+ backward) and
// kernelforge::fused_linear_cross_entropy (the core's chunk loop over cuBLASLt GEMMs and our
// cross-entropy kernels: the [tokens, vocab] logits never exist at once), with their autograd.
// Schemas: the TORCH_LIBRARY_FRAGMENT at the end. Fake impls: python/kernelforge/cross_entropy.py.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/cross_entropy.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

constexpr EnumName<kf::Reduction> kReductions[] = {
    {"none", kf::Reduction::kNone}, {"mean", kf::Reduction::kMean}, {"sum", kf::Reduction::kSum}};

kf::Reduction reduction_of(const char* op, c10::string_view reduction) {
  return parse_enum(op, "reduction", reduction, kReductions);
}

kf::CrossEntropyOptions options(int64_t ignore_index, double smoothing, double z_loss, double softcap,
                                kf::Reduction reduction) {
  kf::CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  o.label_smoothing = smoothing;
  o.z_loss_scale = z_loss;
  o.softcap = softcap;
  o.reduction = reduction;
  return o;
}

// One forward call into the core: row_loss/lse/valid (and loss unless kNone) written in place.
// cuda = our kernels (float64 CUDA logits: the CPU reference, once warned); else the reference.
void ce_forward_into(const char* op, const Tensor& logits, const Tensor& target, const kf::CrossEntropyOptions& o,
                     const Tensor& row_loss, const Tensor& lse, const Tensor& loss, const Tensor& valid) {
  if (logits.is_cuda() && needs_fallback(op, logits)) {
    Tensor rl = row_loss.cpu(), ls = lse.cpu(), l = loss.cpu(), v = valid.cpu();
    check(kf::ref::cross_entropy(view(logits.cpu()), view(target.cpu()), o, view(rl), view(ls), view(l), view(v)));
    row_loss.copy_(rl), lse.copy_(ls), loss.copy_(l), valid.copy_(v);
    return;
  }
  if (logits.is_cuda()) {
    c10::cuda::CUDAGuard guard(logits.device());
    const int64_t t = logits.dim() == 2 ? logits.size(0) : 0, v = logits.dim() == 2 ? logits.size(1) : 0;
    const Tensor ws = workspace(logits, kf::cross_entropy_workspace_size(t, v));
    check(kf::cross_entropy(view(logits), view(target), o, view(row_loss), view(lse), view(loss), view(valid),
                            ws.data_ptr(), size_t(ws.numel()), stream_of(logits)));
  } else {
    check(kf::ref::cross_entropy(view(logits), view(target), o, view(row_loss), view(lse), view(loss), view(valid)));
  }
}

void ce_backward_into(const char* op, const Tensor& dloss, const Tensor& logits, const Tensor& target,
                      const Tensor& lse, const Tensor& valid, const kf::CrossEntropyOptions& o, const Tensor& dlogits) {
  if (logits.is_cuda() && needs_fallback(op, logits)) {
    Tensor d = dlogits.cpu();
    check(kf::ref::cross_entropy_backward(view(dloss.cpu()), view(logits.cpu()), view(target.cpu()), view(lse.cpu()),
                                          view(valid.cpu()), o, view(d)));
    dlogits.copy_(d);
    return;
  }
  if (logits.is_cuda()) {
    c10::cuda::CUDAGuard guard(logits.device());
    check(kf::cross_entropy_backward(view(dloss), view(logits), view(target), view(lse), view(valid), o, view(dlogits),
                                     stream_of(logits)));
  } else {
    check(kf::ref::cross_entropy_backward(view(dloss), view(logits), view(target), view(lse), view(valid), o,
                                          view(dlogits)));
  }
}

Tensor f32_empty(const Tensor& like, at::IntArrayRef sizes) {
  return at::empty(sizes, like.options().dtype(at::kFloat));
}

// ---- cross_entropy ------------------------------------------------------------------------------
std::tuple<Tensor, Tensor, Tensor> cross_entropy_impl(const Tensor& logits_in, const Tensor& target,
                                                      int64_t ignore_index, double smoothing, double z_loss,
                                                      double softcap, c10::string_view reduction) {
  const kf::Reduction red = reduction_of("cross_entropy", reduction);
  const kf::CrossEntropyOptions o = options(ignore_index, smoothing, z_loss, softcap, red);
  const Tensor logits = rows(logits_in);
  const int64_t t = logits.dim() >= 1 ? logits.size(0) : 0;
  Tensor row_loss = f32_empty(logits, {t}), lse = f32_empty(logits, {t});
  Tensor loss = f32_empty(logits, {}), valid = f32_empty(logits, {});
  ce_forward_into("cross_entropy", logits, target, o, row_loss, lse, loss, valid);
  const Tensor out = red == kf::Reduction::kNone ? row_loss : loss;
  return {out.to(logits.scalar_type()), lse, valid};
}

Tensor cross_entropy_backward_impl(const Tensor& dloss, const Tensor& logits_in, const Tensor& target,
                                   const Tensor& lse, const Tensor& valid, int64_t ignore_index, double smoothing,
                                   double z_loss, double softcap, c10::string_view reduction) {
  const kf::CrossEntropyOptions o =
      options(ignore_index, smoothing, z_loss, softcap, reduction_of("cross_entropy_backward", reduction));
  const Tensor logits = rows(logits_in);
  Tensor dlogits = at::empty(logits.sizes(), logits.options());
  ce_backward_into("cross_entropy_backward", dloss.to(at::kFloat), logits, target, lse, valid, o, dlogits);
  return dlogits;
}

class CrossEntropyFn : public torch::autograd::Function<CrossEntropyFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& target, int64_t ignore_index,
                               double smoothing, double z_loss, double softcap, c10::string_view reduction) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, int64_t, double, double, double, c10::string_view)>("kernelforge::cross_entropy");
    auto [loss, lse, valid] = op.call(logits, target, ignore_index, smoothing, z_loss, softcap, reduction);
    ctx->save_for_backward({logits, target, lse, valid});
    ctx->saved_data["ii"] = ignore_index;
    ctx->saved_data["ls"] = smoothing;
    ctx->saved_data["z"] = z_loss;
    ctx->saved_data["cap"] = softcap;
    ctx->saved_data["red"] = std::string(reduction);
    ctx->mark_non_differentiable({lse, valid});
    return {loss, lse, valid};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("cross_entropy");
    auto s = ctx->get_saved_variables();
    static auto op =
        op_handle<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, double,
                         double, double, c10::string_view)>("kernelforge::cross_entropy_backward");
    const Tensor g = grads[0].defined() ? grads[0] : at::zeros_like(s[3]);
    Tensor d = op.call(g, s[0], s[1], s[2], s[3], ctx->saved_data["ii"].toInt(), ctx->saved_data["ls"].toDouble(),
                       ctx->saved_data["z"].toDouble(), ctx->saved_data["cap"].toDouble(),
                       ctx->saved_data["red"].toStringRef());
    return {d, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> cross_entropy_autograd(const Tensor& logits, const Tensor& target,
                                                          int64_t ignore_index, double smoothing, double z_loss,
                                                          double softcap, c10::string_view reduction) {
  auto r = CrossEntropyFn::apply(logits, target, ignore_index, smoothing, z_loss, softcap, reduction);
  return {r[0], r[1], r[2]};
}

// ---- vocabulary-parallel shards -------------------------------------------------------------------
// The logits are classes [class_start, class_start + V) of num_classes (cross_entropy.h). The forward
// gives the shard's row_loss (z-loss 0: it needs the global lse) and lse; the caller combines them over
// the shards (kernelforge/distributed.py). The backward takes the global lse and the per-row loss
// gradient and writes dlogits, which may be logits itself (in place: the chunks of the fused linear
// form). No autograd of their own: the Python autograd function calls them.
std::tuple<Tensor, Tensor> cross_entropy_shard_impl(const Tensor& logits_in, const Tensor& target, int64_t class_start,
                                                    int64_t num_classes, int64_t ignore_index, double smoothing,
                                                    double softcap) {
  kf::CrossEntropyOptions o = options(ignore_index, smoothing, 0.0, softcap, kf::Reduction::kNone);
  o.class_start = class_start;
  o.num_classes = num_classes;
  const Tensor logits = rows(logits_in);
  const int64_t t = logits.dim() >= 1 ? logits.size(0) : 0;
  Tensor row_loss = f32_empty(logits, {t}), lse = f32_empty(logits, {t});
  Tensor loss = f32_empty(logits, {}), valid = f32_empty(logits, {});
  ce_forward_into("cross_entropy_shard", logits, target, o, row_loss, lse, loss, valid);
  return {row_loss, lse};
}

void cross_entropy_shard_backward_impl(const Tensor& dloss, const Tensor& logits, const Tensor& target,
                                       const Tensor& lse, int64_t class_start, int64_t num_classes,
                                       int64_t ignore_index, double smoothing, double z_loss, double softcap,
                                       const Tensor& dlogits) {
  kf::CrossEntropyOptions o = options(ignore_index, smoothing, z_loss, softcap, kf::Reduction::kNone);
  o.class_start = class_start;
  o.num_classes = num_classes;
  const Tensor valid = at::ones({}, logits.options().dtype(at::kFloat));  // unused by reduction "none"
  ce_backward_into("cross_entropy_shard_backward", dloss.to(at::kFloat), logits, target, lse, valid, o, dlogits);
}

// ---- fused_linear_cross_entropy -----------------------------------------------------------------
// The chunk loop is the core's (kernelforge::fused_linear_cross_entropy, cross_entropy.h): cuBLASLt
// GEMMs and our cross-entropy kernels over one [C, V] logits chunk at a time. This binding allocates
// the outputs and the workspace, and bounds the chunk by the free memory it can see (the core's default
// bounds it by the problem only): a quarter of what the device and torch's cache have free.
// For mean / sum the gradients are computed in the forward (for a loss gradient of 1) and scaled in
// place by the loss gradient in the backward (a second backward through the same graph is refused);
// "none" recomputes the chunks in the backward.
constexpr int64_t kFlceChunkAlign = 128;  // tokens: a GEMM tile multiple

int64_t flce_free_chunk(const Tensor& weight, int64_t padded_vocab, int64_t chunk) {
  if (!weight.is_cuda() || at::cuda::currentStreamCaptureStatusMayInitCtx() != at::cuda::CaptureStatus::None)
    return chunk;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return chunk;
  }
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(weight.get_device());
  const int64_t cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
  const int64_t budget = (int64_t(free_b) + std::max<int64_t>(cached, 0)) / 4;
  int64_t c = std::max<int64_t>(1, budget / std::max<int64_t>(1, padded_vocab * int64_t(weight.element_size())));
  if (c >= kFlceChunkAlign) c -= c % kFlceChunkAlign;
  return std::min(chunk, c);
}

// The outputs of one call: row_loss, lse, valid, loss (float32) and the gradients asked for (dbias in
// float32, converted by the caller).
struct FlceBuffers {
  Tensor row_loss, lse, valid, loss, dh, dw, db;
  FlceBuffers(const Tensor& hidden, const Tensor& weight, bool gh, bool gw, bool gb) {
    const int64_t t = hidden.dim() == 2 ? hidden.size(0) : 0;
    row_loss = f32_empty(hidden, {t}), lse = f32_empty(hidden, {t});
    valid = f32_empty(hidden, {}), loss = f32_empty(hidden, {});
    if (gh) dh = at::empty(hidden.sizes(), hidden.options());
    if (gw) dw = at::empty(weight.sizes(), weight.options());
    if (gb) db = f32_empty(hidden, {weight.dim() == 2 ? weight.size(0) : 0});
  }
};

// One call into the core: CUDA (float16 / bfloat16 / float32) runs the kernels; CPU tensors, and float64
// CUDA tensors (announced once: needs_fallback), the float64 reference on CPU copies.
void flce_run(const char* op, bool backward, const Tensor& hidden, const Tensor& weight, const Tensor& target,
              const OptTensor& bias, const Tensor& dloss, const kf::CrossEntropyOptions& o, int64_t chunk_tokens,
              FlceBuffers& b, bool want_loss) {
  TORCH_CHECK(chunk_tokens >= 0, op, ": chunk_tokens must be >= 0 (0: chosen from the sizes and free memory)");
  const bool fallback = hidden.is_cuda() && needs_fallback(op, hidden);
  auto host = [&](const Tensor& x) { return fallback && x.defined() ? x.cpu() : x; };
  const Tensor h = host(hidden), w = host(weight), tg = host(target), dl = host(dloss);
  const OptTensor bs = defined(bias) ? OptTensor(host(*bias)) : bias;
  FlceBuffers out = b;
  if (fallback) {
    for (Tensor* x : {&out.row_loss, &out.lse, &out.valid, &out.loss, &out.dh, &out.dw, &out.db})
      if (x->defined()) *x = x->cpu();
  }
  const kf::TensorView hv = view(h), wv = view(w), tv = view(tg), rv = view(out.row_loss), lv = view(out.lse),
                       vv = view(out.valid), sv = view(out.loss);
  kf::TensorView bv, dhv, dwv, dbv, dlv;
  kf::FlceTensors t;
  t.hidden = &hv, t.weight = &wv, t.target = &tv, t.row_loss = &rv, t.lse = &lv, t.valid = &vv;
  t.loss = want_loss ? &sv : nullptr;
  if (defined(bs)) bv = view(*bs), t.bias = &bv;
  if (out.dh.defined()) dhv = view(out.dh), t.dhidden = &dhv;
  if (out.dw.defined()) dwv = view(out.dw), t.dweight = &dwv;
  if (out.db.defined()) dbv = view(out.db), t.dbias = &dbv;
  if (backward) dlv = view(dl), t.dloss = &dlv;
  if (h.is_cuda()) {
    c10::cuda::CUDAGuard guard(h.device());
    kf::FlcePlan plan;
    size_t bytes = 0;
    check(kf::fused_linear_cross_entropy_plan(t, o, chunk_tokens, &plan, &bytes));
    if (chunk_tokens == 0) {
      const int64_t c = flce_free_chunk(w, plan.padded_vocab, plan.chunk_tokens);
      if (c != plan.chunk_tokens) check(kf::fused_linear_cross_entropy_plan(t, o, c, &plan, &bytes));
    }
    const Tensor ws = workspace(h, bytes);
    check(backward ? kf::fused_linear_cross_entropy_backward(plan, t, o, ws.data_ptr(), bytes, stream_of(h))
                   : kf::fused_linear_cross_entropy(plan, t, o, ws.data_ptr(), bytes, stream_of(h)));
  } else {
    check(backward ? kf::ref::fused_linear_cross_entropy_backward(t, o) : kf::ref::fused_linear_cross_entropy(t, o));
  }
  if (fallback) {  // the outputs back (the backward's lse is an input)
    Tensor* dst[] = {&b.row_loss, &b.lse, &b.valid, &b.loss, &b.dh, &b.dw, &b.db};
    const Tensor* src[] = {&out.row_loss, &out.lse, &out.valid, &out.loss, &out.dh, &out.dw, &out.db};
    for (int i = 0; i < 7; ++i)
      if (dst[i]->defined() && !(backward && i == 1)) dst[i]->copy_(*src[i]);
  }
}

// Hidden and weight as the core takes them: stride 1 along the hidden size and rows that do not overlap
// (a copy only otherwise: e.g. a transposed view, or a row broadcast with expand, stride 0).
Tensor hidden_rows(const Tensor& x) {
  if (x.dim() != 2) return x;
  const bool cols = x.size(1) > 1 && x.stride(1) != 1;
  const bool rows = x.size(0) > 1 && x.size(1) > 0 && x.stride(0) < x.size(1);
  return cols || rows ? x.contiguous() : x;
}

// (dhidden, dweight, dbias); absent ones are empty [0] tensors, as the ops return them
std::tuple<Tensor, Tensor, Tensor> flce_grads(const FlceBuffers& b, const Tensor& hidden, const OptTensor& bias) {
  auto or_empty = [&](const Tensor& t) { return t.defined() ? t : at::empty({0}, hidden.options()); };
  return {or_empty(b.dh), or_empty(b.dw), or_empty(b.db.defined() ? b.db.to(bias->scalar_type()) : Tensor())};
}

// returns (loss, lse, dhidden, dweight, dbias); the gradients are empty unless computed here
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> flce_forward_impl(
    const Tensor& hidden_in, const Tensor& weight_in, const Tensor& target, const OptTensor& bias, int64_t ignore_index,
    double smoothing, double z_loss, double softcap, c10::string_view reduction, int64_t chunk_tokens, bool grad_hidden,
    bool grad_weight, bool grad_bias) {
  const char* op = "fused_linear_cross_entropy";
  const kf::Reduction red = reduction_of(op, reduction);
  const Tensor hidden = hidden_rows(hidden_in), weight = hidden_rows(weight_in);
  const bool has_bias = defined(bias);
  const bool grads = red != kf::Reduction::kNone && (grad_hidden || grad_weight || (grad_bias && has_bias));
  FlceBuffers b(hidden, weight, grads && grad_hidden, grads && grad_weight, grads && grad_bias && has_bias);
  flce_run(op, false, hidden, weight, target, bias, Tensor(), options(ignore_index, smoothing, z_loss, softcap, red),
           chunk_tokens, b, red != kf::Reduction::kNone);
  auto [dh, dw, db] = flce_grads(b, hidden, bias);
  return {red == kf::Reduction::kNone ? b.row_loss : b.loss, b.lse, dh, dw, db};
}

// reduction="none": the gradients for the per-row loss gradient dloss [T], chunks recomputed.
std::tuple<Tensor, Tensor, Tensor> flce_backward_impl(const Tensor& dloss, const Tensor& hidden_in,
                                                      const Tensor& weight_in, const Tensor& target,
                                                      const OptTensor& bias, const Tensor& lse, int64_t ignore_index,
                                                      double smoothing, double z_loss, double softcap,
                                                      int64_t chunk_tokens, bool grad_hidden, bool grad_weight,
                                                      bool grad_bias) {
  const char* op = "fused_linear_cross_entropy_backward";
  const Tensor hidden = hidden_rows(hidden_in), weight = hidden_rows(weight_in);
  FlceBuffers b(hidden, weight, grad_hidden, grad_weight, grad_bias && defined(bias));
  b.lse = lse;
  const int64_t t = hidden.dim() == 2 ? hidden.size(0) : 0;
  flce_run(op, true, hidden, weight, target, bias, dloss.to(at::kFloat).reshape({t}),
           options(ignore_index, smoothing, z_loss, softcap, kf::Reduction::kNone), chunk_tokens, b, false);
  return flce_grads(b, hidden, bias);
}

// The public op without autograd (inference, or below the autograd layer): the loss only.
Tensor flce_impl(const Tensor& hidden, const Tensor& weight, const Tensor& target, const OptTensor& bias,
                 int64_t ignore_index, double smoothing, double z_loss, double softcap, c10::string_view reduction,
                 int64_t chunk_tokens) {
  return std::get<0>(flce_forward_impl(hidden, weight, target, bias, ignore_index, smoothing, z_loss, softcap,
                                       reduction, chunk_tokens, false, false, false));
}

using FlceFwdSig = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                      const OptTensor&, int64_t, double, double, double,
                                                                      c10::string_view, int64_t, bool, bool, bool);
using FlceBwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                      const OptTensor&, const Tensor&, int64_t, double, double, double,
                                                      int64_t, bool, bool, bool);

class FlceFn : public torch::autograd::Function<FlceFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight, const Tensor& target,
                        const OptTensor& bias, int64_t ignore_index, double smoothing, double z_loss, double softcap,
                        c10::string_view reduction, int64_t chunk_tokens) {
    const bool gh = hidden.requires_grad(), gw = weight.requires_grad();
    const bool gb = bias.has_value() && bias->defined() && bias->requires_grad();
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<FlceFwdSig>("kernelforge::fused_linear_cross_entropy_forward");
    auto [loss, lse, dh, dw, db] = op.call(hidden, weight, target, bias, ignore_index, smoothing, z_loss, softcap,
                                           reduction, chunk_tokens, gh, gw, gb);
    const bool scalar = reduction_of("fused_linear_cross_entropy", reduction) != kf::Reduction::kNone;
    ctx->saved_data["scalar"] = scalar;
    ctx->saved_data["flags"] = int64_t(gh) | int64_t(gw) << 1 | int64_t(gb) << 2;
    if (scalar) {
      ctx->save_for_backward({dh, dw, db});
    } else {
      ctx->save_for_backward({hidden, weight, target, bias.value_or(Tensor()), lse});
      ctx->saved_data["ii"] = ignore_index;
      ctx->saved_data["ls"] = smoothing;
      ctx->saved_data["z"] = z_loss;
      ctx->saved_data["cap"] = softcap;
      ctx->saved_data["chunk"] = chunk_tokens;
    }
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("fused_linear_cross_entropy");
    auto s = ctx->get_saved_variables();
    const int64_t flags = ctx->saved_data["flags"].toInt();
    const bool gh = flags & 1, gw = flags & 2, gb = flags & 4;
    const Tensor& g = grads[0];
    Tensor dh, dw, db;
    if (ctx->saved_data["scalar"].toBool()) {
      // d(loss)/d(.) was computed for g = 1 in the forward; scale by the incoming gradient in place
      // (no second [V, H] buffer: the saved gradients are handed over). A second backward through
      // the same graph (retain_graph=True) would find them already scaled: an error, not a wrong answer.
      TORCH_CHECK(!ctx->saved_data.count("done"),
                  "fused_linear_cross_entropy: backward through the same graph "
                  "twice (retain_graph=True) is not supported; recompute the loss for each backward");
      ctx->saved_data["done"] = true;
      // One multi-tensor launch with 16-byte accesses: mul_ by a 0-dim CUDA tensor broadcasts it with
      // stride 0, which TensorIterator does not vectorize (2.2 ms against 0.5 for the 1 GB dweight of
      // a 128256 x 4096 bf16 head on the H200). torch's fast path takes the scale in the gradients'
      // dtype: exact for 1 and powers of two, one more rounding of a bf16 / fp16 scale otherwise.
      std::vector<Tensor> scaled;
      if (gh) scaled.push_back(s[0]);
      if (gw) scaled.push_back(s[1]);
      if (gb) scaled.push_back(s[2]);
      if (!scaled.empty()) at::_foreach_mul_(scaled, g.to(scaled[0].scalar_type()));
      if (gh) dh = s[0];
      if (gw) dw = s[1];
      if (gb) db = s[2];
    } else {
      const OptTensor bias = saved_opt(s[3]);
      static auto op = op_handle<FlceBwdSig>("kernelforge::fused_linear_cross_entropy_backward");
      std::tie(dh, dw, db) = op.call(g, s[0], s[1], s[2], bias, s[4], ctx->saved_data["ii"].toInt(),
                                     ctx->saved_data["ls"].toDouble(), ctx->saved_data["z"].toDouble(),
                                     ctx->saved_data["cap"].toDouble(), ctx->saved_data["chunk"].toInt(), gh, gw, gb);
    }
    // (not grad_or_empty: numel() is symbolic under torch.compile's dynamic shapes; the flags say it)
    return {gh ? dh : Tensor(), gw ? dw : Tensor(), Tensor(), gb ? db : Tensor(), Tensor(),
            Tensor(),           Tensor(),           Tensor(), Tensor(),           Tensor()};
  }
};

Tensor flce_autograd(const Tensor& hidden, const Tensor& weight, const Tensor& target, const OptTensor& bias,
                     int64_t ignore_index, double smoothing, double z_loss, double softcap, c10::string_view reduction,
                     int64_t chunk_tokens) {
  return FlceFn::apply(hidden, weight, target, bias, ignore_index, smoothing, z_loss, softcap, reduction, chunk_tokens);
}

}  // namespace

// reduction: "none", "mean" or "sum"; softcap 0 = none. fused_linear_cross_entropy_forward computes
// the gradients too (reduction mean/sum); _backward recomputes the chunks (reduction none). One impl
// serves CPU (the reference + CPU GEMMs) and CUDA (our kernels + cuBLAS): the core call is chosen by
// the tensors' device inside.
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&cross_entropy_impl, &cross_entropy_autograd>(
      m,
      "cross_entropy(Tensor logits, Tensor target, int ignore_index, float label_smoothing, float z_loss_scale, "
      "float softcap, str reduction) -> (Tensor, Tensor, Tensor)");
  def_op<&cross_entropy_backward_impl>(
      m,
      "cross_entropy_backward(Tensor dloss, Tensor logits, Tensor target, Tensor lse, Tensor valid, int ignore_index, "
      "float label_smoothing, float z_loss_scale, float softcap, str reduction) -> Tensor");
  def_op<&cross_entropy_shard_impl>(
      m,
      "cross_entropy_shard(Tensor logits, Tensor target, int class_start, int num_classes, int ignore_index, "
      "float label_smoothing, float softcap) -> (Tensor, Tensor)");
  def_op<&cross_entropy_shard_backward_impl>(
      m,
      "cross_entropy_shard_backward(Tensor dloss, Tensor logits, Tensor target, Tensor lse, int class_start, "
      "int num_classes, int ignore_index, float label_smoothing, float z_loss_scale, float softcap, "
      "Tensor(a!) dlogits) -> ()");
  def_op<&flce_impl, &flce_autograd>(
      m,
      "fused_linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
      "float label_smoothing, float z_loss_scale, float softcap, str reduction, int chunk_tokens) -> Tensor");
  def_op<&flce_forward_impl>(
      m,
      "fused_linear_cross_entropy_forward(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
      "float label_smoothing, float z_loss_scale, float softcap, str reduction, int chunk_tokens, bool grad_hidden, "
      "bool grad_weight, bool grad_bias) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  def_op<&flce_backward_impl>(
      m,
      "fused_linear_cross_entropy_backward(Tensor dloss, Tensor hidden, Tensor weight, Tensor target, Tensor? bias, "
      "Tensor lse, int ignore_index, float label_smoothing, float z_loss_scale, float softcap, int chunk_tokens, "
      "bool grad_hidden, bool grad_weight, bool grad_bias) -> (Tensor, Tensor, Tensor)");
}
