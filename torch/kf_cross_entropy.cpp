// PyTorch binding of the cross-entropy family: kernelforge::cross_entropy (+ backward) over our
// kernels, and kernelforge::fused_linear_cross_entropy composed here from cuBLAS GEMMs (at::mm) and
// the cross-entropy kernels, chunked over tokens so the [tokens, vocab] logits never exist at once.
// Schemas: the TORCH_LIBRARY_FRAGMENT at the end. Fake impls: python/kernelforge/cross_entropy.py.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <string>
#include <tuple>

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
// loss of logits = hidden @ weight^T (+ bias) without the [T, V] logits: for each chunk of C tokens
//   logits_c = hidden_c @ weight^T (+ bias)             cuBLAS, [C, V] in the weight's dtype
//   row_loss_c, lse_c = cross_entropy(logits_c)          our kernels (one read)
//   and, when gradients are wanted and the reduction is mean/sum (the gradient of a scalar loss is
//   known up to the loss gradient g, which the backward multiplies in):
//   logits_c <- dlogits_c (g = 1)                        our backward kernel, in place
//   dhidden_c = dlogits_c @ weight,  dweight += dlogits_c^T @ hidden_c,  dbias += sum_rows dlogits_c
// Extra memory: one [C, V] chunk (C from free memory and kFlceChunkCapBytes) plus float32 [V] and
// [T] vectors (and, for an odd vocabulary on CUDA, a zero-padded copy of the weight: FlceWeight).
// reduction="none": the gradients need the per-row g, so the backward recomputes the chunks (one
// more GEMM per chunk).
// Logits chunk: at most kFlceChunkCapBytes, a quarter of free memory, and an eighth of the [T, V]
// float32 logits the eager path would hold (T / 4 tokens in bf16: 4 chunks at any size, so the
// extra memory stays a small share of eager's). Each chunk after the first costs one more
// read-modify-write of dweight in the dW GEMM (beta = 1: 2 x 1 GB at V x H = 128256 x 4096 bf16,
// ~0.7 ms on an H100) and one more rounding of the running sum (measured, 8192 x 4096 x 128256
// fwd+bwd: 40.0 ms with 4 chunks, 39.3-39.7 ms with 2 chunks of 1 GiB; torch.compile 37.7-38.2 ms).
constexpr int64_t kFlceChunkCapBytes = int64_t(1) << 30;
constexpr int64_t kFlceEagerShare = 8;    // chunk bytes <= T * V * 4 / kFlceEagerShare
constexpr int64_t kFlceChunkAlign = 128;  // tokens: a GEMM tile multiple

int64_t flce_chunk(const Tensor& weight, int64_t tokens, int64_t asked) {
  if (asked > 0) return std::max<int64_t>(1, std::min(asked, tokens));
  int64_t budget = kFlceChunkCapBytes;
  if (weight.is_cuda() && at::cuda::currentStreamCaptureStatusMayInitCtx() == at::cuda::CaptureStatus::None) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(weight.get_device());
      const int64_t cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
      budget = std::min<int64_t>(budget, (int64_t(free_b) + std::max<int64_t>(cached, 0)) / 4);
    } else {
      cudaGetLastError();
    }
  }
  budget = std::min<int64_t>(budget, std::max<int64_t>(1, tokens * weight.size(0) * 4 / kFlceEagerShare));
  const int64_t row_bytes = std::max<int64_t>(1, weight.size(0) * int64_t(weight.element_size()));
  int64_t c = std::max<int64_t>(1, budget / row_bytes);
  if (c >= kFlceChunkAlign) c -= c % kFlceChunkAlign;
  return std::min(c, std::max<int64_t>(tokens, 1));
}

// Message pieces as plain strings (shape via kf_common.h's shape_str, dtype "BFloat16", device
// "cuda:0"): see shape_str for why nothing numeric is streamed into TORCH_CHECK (covered by
// test_flce_all_ignored_and_errors[cuda]).
const char* msg_dtype(const Tensor& t) { return c10::toString(t.scalar_type()); }
std::string msg_device(const Tensor& t) { return t.device().str(); }

void flce_check(const char* op, const Tensor& hidden, const Tensor& weight, const Tensor& target,
                const OptTensor& bias) {
  TORCH_CHECK(hidden.dim() == 2, op, ": hidden must have shape [tokens, hidden] (2 dimensions), got ",
              shape_str(hidden));
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(1), op, ": weight must have shape [vocab, ",
              std::to_string(hidden.size(1)), "] to match hidden's last dimension, got ", shape_str(weight));
  TORCH_CHECK(weight.size(0) >= 1, op, ": weight must have at least one row (vocab >= 1)");
  TORCH_CHECK(at::isFloatingType(hidden.scalar_type()), op, ": hidden must be a floating-point tensor, got ",
              msg_dtype(hidden));
  TORCH_CHECK(weight.scalar_type() == hidden.scalar_type(), op, ": weight must have the dtype of hidden (",
              msg_dtype(hidden), "), got ", msg_dtype(weight));
  TORCH_CHECK(weight.device() == hidden.device(), op, ": weight must be on the device of hidden (", msg_device(hidden),
              "), got ", msg_device(weight));
  TORCH_CHECK(target.dim() == 1 && target.size(0) == hidden.size(0), op, ": target must have shape [",
              std::to_string(hidden.size(0)), "] to match hidden's tokens, got ", shape_str(target));
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kInt, op,
              ": target must be an int64 (or int32) tensor of class indices, got ", msg_dtype(target));
  TORCH_CHECK(target.device() == hidden.device(), op, ": target must be on the device of hidden (", msg_device(hidden),
              "), got ", msg_device(target));
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must have shape [",
                std::to_string(weight.size(0)), "], got ", shape_str(*bias));
    TORCH_CHECK(bias->scalar_type() == hidden.scalar_type(), op, ": bias must have the dtype of hidden (",
                msg_dtype(hidden), "), got ", msg_dtype(*bias));
    TORCH_CHECK(bias->device() == hidden.device(), op, ": bias must be on the device of hidden (", msg_device(hidden),
                "), got ", msg_device(*bias));
  }
}

// The weight (and bias) the GEMMs use. On CUDA a vocabulary whose rows are not a multiple of 16
// bytes (an odd one, e.g. GPT-2's 50257) is padded with zero rows to Vp (V rounded up to 16 bytes):
// cuBLAS ran the three GEMMs of H100 bf16 4096 x 2048 x 50257 at 100 / 136 / 496 TF/s against
// ~760 at 50304, and the padded logits rows start 16-byte aligned for the
// cross-entropy kernels. The padding columns of the logits are exactly 0 (zero weight rows and
// bias) and are never read by the loss; their gradient is set to 0 before the backward GEMMs.
// Costs one copy of the weight per call (V x H elements, ~0.3 ms at 50257 x 4096 bf16).
struct FlceWeight {
  Tensor w;        // [Vp, H]
  OptTensor b;     // [Vp] or none
  int64_t v = 0;   // vocabulary
  int64_t vp = 0;  // padded vocabulary (v when not padded)
  FlceWeight(const Tensor& weight, const OptTensor& bias) : w(weight), b(bias), v(weight.size(0)), vp(weight.size(0)) {
    const int64_t per16 = 16 / int64_t(weight.element_size());
    if (!weight.is_cuda() || v % per16 == 0) return;
    vp = (v + per16 - 1) / per16 * per16;
    w = at::empty({vp, weight.size(1)}, weight.options());
    w.narrow(0, 0, v).copy_(weight);
    w.narrow(0, v, vp - v).zero_();
    if (bias.has_value() && bias->defined()) {
      Tensor bp = at::zeros({vp}, bias->options());
      bp.narrow(0, 0, v).copy_(*bias);
      b = bp;
    }
  }
  bool padded() const { return vp != v; }
  bool has_bias() const { return b.has_value() && b->defined(); }
  // logits of the chunk, [C, Vp]
  Tensor logits(const Tensor& hc) const { return has_bias() ? at::addmm(*b, hc, w.t()) : at::mm(hc, w.t()); }
};

// The gradients of hidden, weight and bias, accumulated chunk by chunk from the chunk's dlogits
// (held in its logits buffer, [C, Vp]). dweight is written by the first chunk's GEMM (beta = 0), so
// it is only zero-filled when there is no chunk at all (0 tokens); dbias sums in float32. With a
// padded vocabulary dweight is computed [Vp, H] and its first V rows returned (a contiguous view).
struct FlceGrads {
  Tensor dh, dw, db_acc;
  FlceGrads(const Tensor& hidden, const FlceWeight& fw, bool gh, bool gw, bool gb) {
    if (gh) dh = at::empty(hidden.sizes(), hidden.options());
    if (gw) dw = hidden.size(0) > 0 ? at::empty(fw.w.sizes(), fw.w.options()) : at::zeros(fw.w.sizes(), fw.w.options());
    if (gb && fw.has_bias()) db_acc = at::zeros({fw.vp}, hidden.options().dtype(at::kFloat));
  }
  void add_chunk(const Tensor& dl, const Tensor& hc, const FlceWeight& fw, int64_t c0) {
    if (fw.padded()) dl.narrow(1, fw.v, fw.vp - fw.v).zero_();
    if (dh.defined()) {
      Tensor dh_c = dh.narrow(0, c0, hc.size(0));
      at::mm_out(dh_c, dl, fw.w);
    }
    if (dw.defined()) {
      if (c0 == 0) {
        at::mm_out(dw, dl.t(), hc);
      } else {
        dw.addmm_(dl.t(), hc);
      }
    }
    if (db_acc.defined()) db_acc.add_(at::sum(dl, {0}, false, at::kFloat));
  }
  // (dhidden, dweight, dbias); absent ones are empty [0] tensors, as the ops return them
  std::tuple<Tensor, Tensor, Tensor> finish(const Tensor& hidden, const OptTensor& bias, const FlceWeight& fw) const {
    auto or_empty = [&](const Tensor& t) { return t.defined() ? t : at::empty({0}, hidden.options()); };
    const Tensor dwv = dw.defined() ? dw.narrow(0, 0, fw.v) : dw;
    const Tensor db = db_acc.defined() ? db_acc.narrow(0, 0, fw.v).to(bias->scalar_type()) : Tensor();
    return {or_empty(dh), or_empty(dwv), or_empty(db)};
  }
};

// returns (loss, lse, dhidden, dweight, dbias); the gradients are empty unless computed here
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> flce_forward_impl(
    const Tensor& hidden, const Tensor& weight, const Tensor& target, const OptTensor& bias, int64_t ignore_index,
    double smoothing, double z_loss, double softcap, c10::string_view reduction, int64_t chunk_tokens, bool grad_hidden,
    bool grad_weight, bool grad_bias) {
  const char* op = "fused_linear_cross_entropy";
  flce_check(op, hidden, weight, target, bias);
  const kf::Reduction red = reduction_of(op, reduction);
  const bool has_bias = bias.has_value() && bias->defined();
  const int64_t tokens = hidden.size(0);
  const bool grads = red != kf::Reduction::kNone && (grad_hidden || grad_weight || (grad_bias && has_bias));
  kf::CrossEntropyOptions o = options(ignore_index, smoothing, z_loss, softcap, kf::Reduction::kNone);
  Tensor row_loss = f32_empty(hidden, {tokens}), lse = f32_empty(hidden, {tokens});
  Tensor valid = target.ne(ignore_index).sum().to(at::kFloat);  // all rows (the mean's divisor); no host sync
  Tensor chunk_valid = f32_empty(hidden, {}), unused = f32_empty(hidden, {});
  const FlceWeight fw(weight, bias);
  FlceGrads gr(hidden, fw, grads && grad_hidden, grads && grad_weight, grads && grad_bias);
  const Tensor one = at::ones({}, hidden.options().dtype(at::kFloat));
  kf::CrossEntropyOptions ob = o;
  ob.reduction = red;
  const Tensor h = hidden.contiguous();
  const int64_t c = flce_chunk(weight, tokens, chunk_tokens);
  for (int64_t c0 = 0; c0 < tokens; c0 += c) {
    const int64_t n = std::min(c, tokens - c0);
    const Tensor hc = h.narrow(0, c0, n), tc = target.narrow(0, c0, n);
    const Tensor full = fw.logits(hc), logits = full.narrow(1, 0, fw.v);
    const Tensor lse_c = lse.narrow(0, c0, n);
    ce_forward_into(op, logits, tc, o, row_loss.narrow(0, c0, n), lse_c, unused, chunk_valid);
    if (!grads) continue;
    ce_backward_into(op, one, logits, tc, lse_c, valid, ob, logits);  // in place: logits <- dlogits (g = 1)
    gr.add_chunk(full, hc, fw, c0);
  }
  Tensor loss =
      red == kf::Reduction::kNone ? row_loss : (red == kf::Reduction::kMean ? row_loss.sum() / valid : row_loss.sum());
  auto [dh, dw, db] = gr.finish(hidden, bias, fw);
  return {loss, lse, dh, dw, db};
}

// reduction="none": the gradients for the per-row loss gradient dloss [T], chunks recomputed.
std::tuple<Tensor, Tensor, Tensor> flce_backward_impl(const Tensor& dloss, const Tensor& hidden, const Tensor& weight,
                                                      const Tensor& target, const OptTensor& bias, const Tensor& lse,
                                                      int64_t ignore_index, double smoothing, double z_loss,
                                                      double softcap, int64_t chunk_tokens, bool grad_hidden,
                                                      bool grad_weight, bool grad_bias) {
  const char* op = "fused_linear_cross_entropy_backward";
  flce_check(op, hidden, weight, target, bias);
  const int64_t tokens = hidden.size(0);
  kf::CrossEntropyOptions o = options(ignore_index, smoothing, z_loss, softcap, kf::Reduction::kNone);
  const Tensor g = dloss.to(at::kFloat).reshape({tokens});
  const Tensor valid = at::ones({}, hidden.options().dtype(at::kFloat));  // unused for kNone
  const FlceWeight fw(weight, bias);
  FlceGrads gr(hidden, fw, grad_hidden, grad_weight, grad_bias);
  const Tensor h = hidden.contiguous();
  const int64_t c = flce_chunk(weight, tokens, chunk_tokens);
  for (int64_t c0 = 0; c0 < tokens; c0 += c) {
    const int64_t n = std::min(c, tokens - c0);
    const Tensor hc = h.narrow(0, c0, n), tc = target.narrow(0, c0, n);
    const Tensor full = fw.logits(hc), logits = full.narrow(1, 0, fw.v);
    ce_backward_into(op, g.narrow(0, c0, n), logits, tc, lse.narrow(0, c0, n), valid, o, logits);
    gr.add_chunk(full, hc, fw, c0);
  }
  return gr.finish(hidden, bias, fw);
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
      const Tensor gf = g.to(at::kFloat);
      if (gh) dh = s[0].mul_(gf);
      if (gw) dw = s[1].mul_(gf);
      if (gb) db = s[2].mul_(gf);
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
