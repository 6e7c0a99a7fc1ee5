// The PyTorch binding of the attention family (include/kernelforge/attention.h): the forward op
// kernelforge::attention. CUDA = our kernels, CPU = the float64 reference, Autograd = a guard that
// refuses inputs requiring a gradient (the backward does not exist yet). Fake impl:
// python/kernelforge/attention.py.
//
// layout "bshd": q [B, Sq, Hq, Dqk], out [B, Sq, Hq, Dv]; "bhsd": q [B, Hq, Sq, Dqk], out [B, Hq, Sq, Dv];
// "varlen": q [Tq, Hq, Dqk] packed by cu_seqlens_q / cu_seqlens_k (int32 [B + 1]), out [Tq, Hq, Dv].
// out is contiguous in q's layout. lse (return_lse): float32 [B, Hq, Sq] or [Hq, Tq]; otherwise an
// empty float32 [0] tensor (the schema keeps two outputs). scale None: 1 / sqrt(Dqk). causal is
// bottom-right aligned; window_left / window_right -1: unbounded. max_seqlen_q / _k (varlen only):
// upper bounds of the sequence lengths, 0 = the token count; SymInt so that torch.compile does not
// specialize on them (the fake impl reads neither: new lengths trace nothing new).
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

constexpr const char* kNoBackward =
    "kernelforge.attention: the backward is not implemented yet; q, k, v and sinks must not require grad "
    "(run under torch.no_grad() / torch.inference_mode(), or detach them; kernelforge.patch routes "
    "training to torch's scaled_dot_product_attention)";

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

std::tuple<Tensor, Tensor> attention_impl(bool cuda, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                          std::optional<double> scale, int64_t window_left, int64_t window_right,
                                          double softcap, const OptTensor& sinks, const OptTensor& cu_seqlens_q,
                                          const OptTensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                          c10::string_view layout, bool return_lse) {
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
  if (cuda && needs_fallback("attention", q)) {
    auto res = attention_impl(false, q.cpu(), k.cpu(), v.cpu(), causal, scale, window_left, window_right, softcap,
                              to_cpu(sinks), to_cpu(cu_seqlens_q), to_cpu(cu_seqlens_k), max_seqlen_q, max_seqlen_k,
                              layout, return_lse);
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

// The Autograd kernel sees the SymInt max_seqlen of a torch.compile trace as they are (the CUDA and
// CPU kernels take them as int64_t: they only ever run on concrete values).
using AttentionSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                                std::optional<double>, int64_t, int64_t, double, const OptTensor&,
                                                const OptTensor&, const OptTensor&, c10::SymInt, c10::SymInt,
                                                c10::string_view, bool);

// The backward does not exist yet: a gradient request is an error, never a silent detach.
std::tuple<Tensor, Tensor> attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                              std::optional<double> scale, int64_t window_left, int64_t window_right,
                                              double softcap, const OptTensor& sinks, const OptTensor& cu_seqlens_q,
                                              const OptTensor& cu_seqlens_k, c10::SymInt max_seqlen_q,
                                              c10::SymInt max_seqlen_k, c10::string_view layout, bool return_lse) {
  const bool wants_grad =
      q.requires_grad() || k.requires_grad() || v.requires_grad() || (defined(sinks) && sinks->requires_grad());
  TORCH_CHECK(!(at::GradMode::is_enabled() && wants_grad), kNoBackward);
  at::AutoDispatchBelowADInplaceOrView guard;
  static auto op = op_handle<AttentionSig>("kernelforge::attention");
  return op.call(q, k, v, causal, scale, window_left, window_right, softcap, sinks, cu_seqlens_q, cu_seqlens_k,
                 max_seqlen_q, max_seqlen_k, layout, return_lse);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&attention_impl, &attention_autograd>(
      m,
      "attention(Tensor q, Tensor k, Tensor v, *, bool causal, float? scale, int window_left, int window_right, "
      "float softcap, Tensor? sinks, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, "
      "SymInt max_seqlen_k, str layout, bool return_lse) -> (Tensor out, Tensor lse)");
}
