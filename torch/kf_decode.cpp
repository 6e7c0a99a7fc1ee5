// The PyTorch binding of the decode family (include/kernelforge/decode.h): decode_attention (the Lq
// newest tokens of each sequence against a paged or contiguous KV cache), kv_append (their keys and
// values written into that cache, in place) and rope_kv_append (the same with RoPE of q and k fused).
// CUDA = our kernels, CPU = the float64 reference. All are inference ops: the Autograd key of
// decode_attention and rope_kv_append falls through (inputs that require grad give outputs that do
// not: no graph, no backward), kv_append has no autograd (a mutation of the caches). Fake impls:
// python/kernelforge/decode.py.
//
// decode_attention: q [B, Lq, Hq, D]; k_cache / v_cache [P, page_size, Hkv, D]; seq_lens int32 [B]
// (the new tokens included, read on the device only); block_table int32 [B, max_pages] or None
// (contiguous: sequence b lives in page b). out [B, Lq, Hq, D] contiguous in q's dtype; lse float32
// [B, Lq, Hq] (return_lse), otherwise an empty float32 [0] tensor (the schema keeps two outputs).
// scale None: 1 / sqrt(D); window_left -1: unbounded; softcap 0: none; key_starts int32 [B] or None
// (keys before key_starts[b] invisible: left padding). max_seq_len: a host upper bound
// of every seq_len that sizes the key split, 0 = the cache capacity; SymInt so that torch.compile does
// not specialize on it (the fake impl does not read it). workspace: None (a block from the caching
// allocator per call, its counters zeroed by a memset) or a caller's zeroed block of at least
// decode_attention_workspace_bytes(...) bytes, reused without a memset (decode.h: "Workspace counters").
//
// kv_append: k, v [B, Lq, Hkv, D] written at positions seq_lens[b] - Lq + t of k_cache / v_cache
// (seq_lens: the lengths after the append, as decode_attention takes them); returns nothing.
//
// rope_kv_append: kv_append with HF's rotate-half RoPE of q and k at those positions (cos / sin
// [max_pos, rotary_dim], decode.h); k's rotation and v go into the caches, q's rotation is returned,
// a new contiguous tensor of q's shape and dtype (q is not written).
//
// merge_attention_states: two attention results over disjoint key sets combined by their logsumexp
// (decode.h); inference only like the others.
//
// prefetch_l2: nbytes bytes (None: the rest) of the memory a CUDA tensor spans (its first element to
// its last, any non-negative strides), from offset bytes past its data pointer, asked into the L2 on the tensor's
// current stream (decode.h); writes nothing, returns nothing.
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/decode.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

kf::DecodeOptions make_options(std::optional<double> scale, int64_t window_left, double softcap, int64_t max_seq_len) {
  kf::DecodeOptions o;
  // scale 0 is the core's "1 / sqrt(D)"; an explicit 0 (or a negative value) is no softmax scale
  if (scale.has_value() && !(std::isfinite(*scale) && *scale > 0.0))
    TORCH_CHECK_VALUE(false, "decode_attention: scale must be a finite value > 0 or None (1 / sqrt(head dim)), got " +
                                 std::to_string(*scale));
  o.scale = scale.has_value() ? static_cast<float>(*scale) : 0.0f;
  o.softcap = static_cast<float>(softcap);
  o.window_left = window_left;
  o.max_seq_len = max_seq_len;
  return o;
}

// decode_attention's outputs, shaped from q (a q of the wrong rank is refused here; everything else is
// checked by the core): out contiguous with q's shape and dtype, lse float32 [B, Lq, Hq] or [0]. One
// std::string message: see kf_attention.cpp (GCC 13 + torch 2.11).
std::tuple<Tensor, Tensor> decode_outputs(const Tensor& q, bool return_lse) {
  if (q.dim() != 4)
    TORCH_CHECK_VALUE(false,
                      "decode_attention: q must have 4 dimensions [B, Lq, Hq, D], got " + std::to_string(q.dim()));
  const std::vector<int64_t> lse_shape =
      return_lse ? std::vector<int64_t>{q.size(0), q.size(1), q.size(2)} : std::vector<int64_t>{0};
  return {at::empty(q.sizes(), q.options()), at::empty(lse_shape, q.options().dtype(at::kFloat))};
}

// The views of one decode_attention call and the DecodeTensors over them (this object owns the views
// the tensors point to: it lives as long as the call).
struct DecodeViews {
  kf::TensorView q, k_cache, v_cache, seq_lens, out, lse;
  OptView block_table, sinks, key_starts;
  bool with_lse;
  DecodeViews(const Tensor& q_, const Tensor& k_cache_, const Tensor& v_cache_, const Tensor& seq_lens_,
              const OptTensor& block_table_, const OptTensor& sinks_, const OptTensor& key_starts_, const Tensor& out_,
              const Tensor& lse_, bool return_lse)
      : q(view(q_)),
        k_cache(view(k_cache_)),
        v_cache(view(v_cache_)),
        seq_lens(view(seq_lens_)),
        out(view(out_)),
        lse(view(lse_)),
        block_table(block_table_),
        sinks(sinks_),
        key_starts(key_starts_),
        with_lse(return_lse) {}
  DecodeViews(const DecodeViews&) = delete;
  DecodeViews& operator=(const DecodeViews&) = delete;
  kf::DecodeTensors tensors() const {
    kf::DecodeTensors t;
    t.q = &q;
    t.k_cache = &k_cache;
    t.v_cache = &v_cache;
    t.seq_lens = &seq_lens;
    t.block_table = block_table.get();
    t.out = &out;
    t.lse = with_lse ? &lse : nullptr;
    t.sinks = sinks.get();
    t.key_starts = key_starts.get();
    return t;
  }
};

// A caller's workspace: contiguous memory of q's device holding at least the plan's bytes.
void check_workspace(const Tensor& ws, const Tensor& q, size_t bytes, const kf::DecodePlan& plan) {
  if (!ws.is_cuda() || ws.device() != q.device())
    TORCH_CHECK_VALUE(false, "decode_attention: workspace must be a tensor on q's device (" + q.device().str() +
                                 "), got " + ws.device().str());
  if (!ws.is_contiguous()) TORCH_CHECK_VALUE(false, std::string("decode_attention: workspace must be contiguous"));
  if (size_t(ws.nbytes()) < bytes)
    TORCH_CHECK_VALUE(false, "decode_attention: workspace holds " + std::to_string(ws.nbytes()) + " bytes, the plan " +
                                 kf::to_string(plan) + " needs " + std::to_string(bytes) +
                                 " (kernelforge.decode_workspace sizes and zeroes one)");
}

std::tuple<Tensor, Tensor> decode_attention_impl(bool cuda, const Tensor& q, const Tensor& k_cache,
                                                 const Tensor& v_cache, const Tensor& seq_lens,
                                                 const OptTensor& block_table, std::optional<double> scale,
                                                 int64_t window_left, double softcap, const OptTensor& sinks,
                                                 int64_t max_seq_len, bool return_lse, const OptTensor& key_starts,
                                                 const OptTensor& workspace_) {
  const kf::DecodeOptions o = make_options(scale, window_left, softcap, max_seq_len);
  if (cuda && needs_fallback("decode_attention", q)) {
    auto res = decode_attention_impl(false, q.cpu(), k_cache.cpu(), v_cache.cpu(), seq_lens.cpu(), to_cpu(block_table),
                                     scale, window_left, softcap, to_cpu(sinks), max_seq_len, return_lse,
                                     to_cpu(key_starts), std::nullopt);
    return {std::get<0>(res).to(q.device()), std::get<1>(res).to(q.device())};
  }
  auto [out, lse] = decode_outputs(q, return_lse);
  const DecodeViews views(q, k_cache, v_cache, seq_lens, block_table, sinks, key_starts, out, lse, return_lse);
  const kf::DecodeTensors t = views.tensors();
  if (!cuda) {
    check(kf::ref::decode_attention(t, o));
    return {out, lse};
  }
  c10::cuda::CUDAGuard guard(q.device());
  // Plan (host only: shapes, strides, options, max_seq_len), then the split-KV workspace from the
  // caching allocator when the plan needs one: no host synchronization, stream-ordered on the current
  // stream, so a CUDA graph captures the call and replays it for any new seq_lens. The block comes
  // from the allocator with any contents, so its merge counters (decode.h: "Workspace counters", 256
  // bytes for up to 64 sequence x kv head pairs) are zeroed on the stream first, a memset node in a
  // captured graph.
  // A caller's workspace (decode_workspace) was zeroed once and every completed call leaves its
  // counters zero: no memset node, so the kernel keeps its programmatic edge from the previous kernel.
  kf::DecodePlan plan;
  size_t bytes = 0;
  check(kf::decode_attention_plan(t, o, &plan, &bytes));
  Tensor ws;
  if (bytes > 0 && workspace_.has_value()) {
    ws = *workspace_;
    check_workspace(ws, q, bytes, plan);
  } else if (bytes > 0) {
    ws = workspace(q, bytes);
    C10_CUDA_CHECK(cudaMemsetAsync(ws.data_ptr(), 0, kf::decode_attention_counter_bytes(q.size(0), k_cache.size(2)),
                                   stream_of(q)));
  }
  check(kf::decode_attention(plan, t, o, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream_of(q)));
  return {out, lse};
}

// The bytes of the workspace a CUDA call with these arguments needs (0: the plan does not split the
// keys); 0 for CPU tensors, whose reference needs none.
int64_t decode_attention_workspace_bytes_impl(bool cuda, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                              const Tensor& seq_lens, const OptTensor& block_table,
                                              std::optional<double> scale, int64_t window_left, double softcap,
                                              const OptTensor& sinks, int64_t max_seq_len, bool return_lse,
                                              const OptTensor& key_starts) {
  if (!cuda || needs_fallback("decode_attention", q)) return 0;
  const kf::DecodeOptions o = make_options(scale, window_left, softcap, max_seq_len);
  // the plan reads shapes and strides only: stand-in outputs with the call's layout, never written
  auto [out, lse] = decode_outputs(q, return_lse);
  const DecodeViews views(q, k_cache, v_cache, seq_lens, block_table, sinks, key_starts, out, lse, return_lse);
  const kf::DecodeTensors t = views.tensors();
  c10::cuda::CUDAGuard guard(q.device());
  kf::DecodePlan plan;
  size_t bytes = 0;
  check(kf::decode_attention_plan(t, o, &plan, &bytes));
  return int64_t(bytes);
}

void kv_append_impl(bool cuda, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const Tensor& seq_lens, const OptTensor& block_table) {
  if (cuda && needs_fallback("kv_append", k_cache)) {
    Tensor kc = k_cache.cpu(), vc = v_cache.cpu();
    kv_append_impl(false, kc, vc, k.cpu(), v.cpu(), seq_lens.cpu(), to_cpu(block_table));
    k_cache.copy_(kc);
    v_cache.copy_(vc);
    return;
  }
  const kf::TensorView kcv = view(k_cache), vcv = view(v_cache), kv = view(k), vv = view(v), slv = view(seq_lens);
  const OptView btv(block_table);
  kf::KvAppendTensors t;
  t.k_cache = &kcv;
  t.v_cache = &vcv;
  t.k = &kv;
  t.v = &vv;
  t.seq_lens = &slv;
  t.block_table = btv.get();
  if (!cuda) {
    check(kf::ref::kv_append(t));
    return;
  }
  c10::cuda::CUDAGuard guard(k_cache.device());
  check(kf::kv_append(t, stream_of(k_cache)));
}

Tensor rope_kv_append_impl(bool cuda, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                           const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache, const Tensor& seq_lens,
                           const OptTensor& block_table) {
  if (cuda && needs_fallback("rope_kv_append", k_cache)) {
    Tensor kc = k_cache.cpu(), vc = v_cache.cpu();
    Tensor q_out = rope_kv_append_impl(false, q.cpu(), k.cpu(), v.cpu(), cos.cpu(), sin.cpu(), kc, vc, seq_lens.cpu(),
                                       to_cpu(block_table));
    k_cache.copy_(kc);
    v_cache.copy_(vc);
    return q_out.to(q.device());
  }
  Tensor q_out = at::empty(q.sizes(), q.options());
  const kf::TensorView qv = view(q), qov = view(q_out), kv = view(k), vv = view(v), cv = view(cos), sv = view(sin);
  const kf::TensorView kcv = view(k_cache), vcv = view(v_cache), slv = view(seq_lens);
  const OptView btv(block_table);
  kf::RopeKvAppendTensors t;
  t.q = &qv;
  t.q_out = &qov;
  t.k = &kv;
  t.v = &vv;
  t.cos = &cv;
  t.sin = &sv;
  t.k_cache = &kcv;
  t.v_cache = &vcv;
  t.seq_lens = &slv;
  t.block_table = btv.get();
  if (!cuda) {
    check(kf::ref::rope_kv_append(t));
    return q_out;
  }
  c10::cuda::CUDAGuard guard(k_cache.device());
  check(kf::rope_kv_append(t, stream_of(k_cache)));
  return q_out;
}

// merge_attention_states: o_a, o_b [..., H, D] (one dtype), lse_a, lse_b float32 [..., H] (o_a's shape
// without the head dim, any strides: attention's lse is passed as a transpose view). The leading dims
// are flattened into N rows (a view when the strides allow, else a copy) for the core's [N, H, D] /
// [N, H]; out (o_a's shape and dtype) and lse (float32, o_a's shape without D) are new contiguous
// tensors.
std::tuple<Tensor, Tensor> merge_states_impl(bool cuda, const Tensor& o_a, const Tensor& lse_a, const Tensor& o_b,
                                             const Tensor& lse_b) {
  if (cuda && needs_fallback("merge_attention_states", o_a)) {
    auto res = merge_states_impl(false, o_a.cpu(), lse_a.cpu(), o_b.cpu(), lse_b.cpu());
    return {std::get<0>(res).to(o_a.device()), std::get<1>(res).to(o_a.device())};
  }
  // The shapes the flattening needs are checked here; everything else by the core.
  if (o_a.dim() < 2)
    TORCH_CHECK_VALUE(false, "merge_attention_states: o_a must have at least 2 dimensions [..., H, D], got " +
                                 std::to_string(o_a.dim()));
  const std::vector<int64_t> lead(o_a.sizes().begin(), o_a.sizes().end() - 1);  // [..., H]
  if (!o_b.sizes().equals(o_a.sizes()))
    TORCH_CHECK_VALUE(
        false, "merge_attention_states: o_b must have o_a's shape " + shape_str(o_a) + ", got " + shape_str(o_b));
  for (const auto& [x, name] : {std::pair<const Tensor*, const char*>{&lse_a, "lse_a"}, {&lse_b, "lse_b"}})
    if (!x->sizes().equals(lead))
      TORCH_CHECK_VALUE(false, std::string("merge_attention_states: ") + name +
                                   " must have o_a's shape without the head dim [..., H], got " + shape_str(*x));
  int64_t n = 1;
  for (int64_t d = 0; d + 2 < o_a.dim(); ++d) n *= o_a.size(d);
  const int64_t h = o_a.size(-2), dh = o_a.size(-1);
  Tensor out = at::empty(o_a.sizes(), o_a.options());
  Tensor lse = at::empty(lead, o_a.options().dtype(at::kFloat));
  const Tensor oa = o_a.reshape({n, h, dh}), ob = o_b.reshape({n, h, dh});
  const Tensor la = lse_a.reshape({n, h}), lb = lse_b.reshape({n, h});
  const kf::TensorView oav = view(oa), lav = view(la), obv = view(ob), lbv = view(lb);
  const kf::TensorView ov = view(out.view({n, h, dh})), lv = view(lse.view({n, h}));
  kf::MergeStatesTensors t;
  t.o_a = &oav;
  t.lse_a = &lav;
  t.o_b = &obv;
  t.lse_b = &lbv;
  t.out = &ov;
  t.out_lse = &lv;
  if (!cuda) {
    check(kf::ref::merge_attention_states(t));
    return {out, lse};
  }
  c10::cuda::CUDAGuard guard(o_a.device());
  check(kf::merge_attention_states(t, stream_of(o_a)));
  return {out, lse};
}

// The bytes a strided view spans, from its first element's address to its last one's end: the range
// prefetch_l2 reads (a transposed or padded view covers the memory between its elements too).
int64_t span_bytes(const Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return (last + 1) * int64_t(t.element_size());
}

void prefetch_l2_impl(bool cuda, const Tensor& t, int64_t offset, std::optional<int64_t> nbytes_) {
  TORCH_CHECK_VALUE(cuda, "prefetch_l2: t must be a CUDA tensor (the hint fills a GPU's L2), got a ", t.device().str(),
                    " tensor");
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) {
      std::string strides;
      for (int64_t e = 0; e < t.dim(); ++e) strides += (e ? ", " : "") + std::to_string(t.stride(e));
      TORCH_CHECK_VALUE(
          false, "prefetch_l2: t's strides must be >= 0 (the range starts at its data pointer), got [" + strides + "]");
    }
  }
  const int64_t size = span_bytes(t);
  const int64_t nbytes = nbytes_.has_value() ? *nbytes_ : size - offset;  // None: the rest of the span
  if (offset < 0 || nbytes < 0 || offset > size || nbytes > size - offset) {
    TORCH_CHECK_VALUE(false, "prefetch_l2: the range [offset, offset + nbytes) = [" + std::to_string(offset) + ", " +
                                 std::to_string(offset + nbytes) + ") must lie inside the " + std::to_string(size) +
                                 " bytes t spans");
  }
  if (nbytes == 0) return;
  c10::cuda::CUDAGuard guard(t.device());
  check(kf::prefetch_l2(static_cast<const char*>(t.data_ptr()) + offset, nbytes, stream_of(t)));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&decode_attention_impl>(
      m,
      "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens, Tensor? block_table, *, "
      "float? scale, int window_left, float softcap, Tensor? sinks, SymInt max_seq_len, bool return_lse, "
      "Tensor? key_starts=None, Tensor(a!)? workspace=None) -> (Tensor out, Tensor lse)");
  // Not differentiable: the Autograd key falls through to the CUDA / CPU kernel, whose outputs then do
  // not require grad (without it, torch's fallback would attach a node that warns at backward).
  m.impl("decode_attention", torch::dispatch(c10::DispatchKey::Autograd, torch::CppFunction::makeFallthrough()));
  def_op<&decode_attention_workspace_bytes_impl>(
      m,
      "decode_attention_workspace_bytes(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens, Tensor? "
      "block_table, *, float? scale, int window_left, float softcap, Tensor? sinks, int max_seq_len, bool return_lse, "
      "Tensor? key_starts=None) -> int");
  def_op<&kv_append_impl>(m,
                          "kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor seq_lens, "
                          "Tensor? block_table) -> ()");
  def_op<&rope_kv_append_impl>(
      m,
      "rope_kv_append(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor seq_lens, Tensor? block_table) -> Tensor");
  // Inference only, as decode_attention: q_out does not require grad, whatever q does.
  m.impl("rope_kv_append", torch::dispatch(c10::DispatchKey::Autograd, torch::CppFunction::makeFallthrough()));
  def_op<&merge_states_impl>(
      m, "merge_attention_states(Tensor o_a, Tensor lse_a, Tensor o_b, Tensor lse_b) -> (Tensor out, Tensor lse)");
  m.impl("merge_attention_states", torch::dispatch(c10::DispatchKey::Autograd, torch::CppFunction::makeFallthrough()));
  def_op<&prefetch_l2_impl>(m, "prefetch_l2(Tensor t, int offset, int? nbytes) -> ()");
  m.impl("prefetch_l2", torch::dispatch(c10::DispatchKey::Autograd, torch::CppFunction::makeFallthrough()));
}
