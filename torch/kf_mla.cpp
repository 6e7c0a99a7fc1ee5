// The PyTorch binding of MLA decode (include/kernelforge/mla.h): the Lq newest tokens of H query heads
// against one latent cache (DeepSeek-V2 / V3, absorbed). CUDA = our kernels, CPU = the float64
// reference. An inference op: the Autograd key falls through (inputs that require grad give outputs
// that do not). Fake impl: python/kernelforge/decode.py.
//
// mla_decode: q [B, Lq, H, 576]; kv_cache [P, page_size, 576] (the Python wrapper squeezes a
// [P, page_size, 1, 576] cache); seq_lens int32 [B] (the new tokens included, read on the device
// only); block_table int32 [B, max_pages] or None (contiguous: sequence b lives in page b). out
// [B, Lq, H, 512] contiguous in q's dtype; lse float32 [B, Lq, H] (return_lse), otherwise an empty
// float32 [0] tensor (the schema keeps two outputs). scale None: 1 / sqrt(576). max_seq_len: a host
// upper bound of every seq_len that sizes the key split, 0 = the cache capacity; SymInt so that
// torch.compile does not specialize on it.
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/mla.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

std::tuple<Tensor, Tensor> mla_decode_impl(bool cuda, const Tensor& q, const Tensor& kv_cache, const Tensor& seq_lens,
                                           const OptTensor& block_table, std::optional<double> scale,
                                           int64_t max_seq_len, bool return_lse) {
  if (scale.has_value() && !(std::isfinite(*scale) && *scale > 0.0))
    TORCH_CHECK_VALUE(
        false, "mla_decode: scale must be a finite value > 0 or None (1 / sqrt(576)), got " + std::to_string(*scale));
  kf::MlaDecodeOptions o;
  o.scale = scale.has_value() ? static_cast<float>(*scale) : 0.0f;
  o.max_seq_len = max_seq_len;
  if (cuda && needs_fallback("mla_decode", q)) {
    auto res = mla_decode_impl(false, q.cpu(), kv_cache.cpu(), seq_lens.cpu(), to_cpu(block_table), scale, max_seq_len,
                               return_lse);
    return {std::get<0>(res).to(q.device()), std::get<1>(res).to(q.device())};
  }
  // The outputs' shapes are read from q: a q of the wrong rank is refused here (everything else is
  // checked by the core). One std::string message: see kf_attention.cpp (GCC 13 + torch 2.11).
  if (q.dim() != 4)
    TORCH_CHECK_VALUE(false, "mla_decode: q must have 4 dimensions [B, Lq, H, 576], got " + std::to_string(q.dim()));
  Tensor out = at::empty({q.size(0), q.size(1), q.size(2), kf::kMlaHeadDimV}, q.options());
  const std::vector<int64_t> lse_shape =
      return_lse ? std::vector<int64_t>{q.size(0), q.size(1), q.size(2)} : std::vector<int64_t>{0};
  Tensor lse = at::empty(lse_shape, q.options().dtype(at::kFloat));

  const kf::TensorView qv = view(q), kvv = view(kv_cache), slv = view(seq_lens), ov = view(out), lv = view(lse);
  const OptView btv(block_table);
  kf::MlaDecodeTensors t;
  t.q = &qv;
  t.kv_cache = &kvv;
  t.seq_lens = &slv;
  t.block_table = btv.get();
  t.out = &ov;
  t.lse = return_lse ? &lv : nullptr;
  if (!cuda) {
    check(kf::ref::mla_decode(t, o));
    return {out, lse};
  }
  c10::cuda::CUDAGuard guard(q.device());
  // Plan (host only: shapes, strides, options, max_seq_len), then the split-KV workspace from the
  // caching allocator: no host synchronization, so a CUDA graph captures the call and replays it for
  // any new seq_lens.
  kf::MlaDecodePlan plan;
  size_t bytes = 0;
  check(kf::mla_decode_plan(t, o, &plan, &bytes));
  Tensor ws = bytes > 0 ? workspace(q, bytes) : Tensor();
  check(kf::mla_decode(plan, t, o, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream_of(q)));
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&mla_decode_impl>(
      m,
      "mla_decode(Tensor q, Tensor kv_cache, Tensor seq_lens, Tensor? block_table, *, float? scale, "
      "SymInt max_seq_len, bool return_lse) -> (Tensor out, Tensor lse)");
  // Not differentiable: the Autograd key falls through to the CUDA / CPU kernel (see kf_decode.cpp).
  m.impl("mla_decode", torch::dispatch(c10::DispatchKey::Autograd, torch::CppFunction::makeFallthrough()));
}
