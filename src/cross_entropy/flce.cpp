// The fused linear cross-entropy (cross_entropy.h): the chunk loop over the GEMM family (cuBLASLt)
// and this family's cross-entropy kernels, with three small kernels of its own (flce_kernels.cu).
//
// Per chunk of C tokens (all on `stream`, no host synchronization, so the loop captures in a CUDA graph):
//   logits [C, Vp] = hidden_c Wp^T (+ bp)            gemm, bias epilogue
//   row_loss_c, lse_c                                cross_entropy on the [C, V] view (row stride Vp)
//   logits <- dlogits (loss gradient 1, or dloss_c)  cross_entropy_backward in place
//   the padding columns V..Vp of dlogits <- 0        (they enter dhidden's K = Vp)
//   dhidden_c = dlogits Wp                           gemm, b = Wp^T (a column-major view)
//   dweight (+)= dlogits[:, :V]^T hidden_c           gemm, a = dlogits^T and b = hidden_c^T (views);
//                                                    the first chunk writes (beta 0), the others add
//   dbias += column sums of dlogits[:, :V]           flce_column_sum, float32
// Bytes beyond the GEMMs: the chunk's logits are written once by the GEMM, read by the forward, read
// and written by the backward, read by the two gradient GEMMs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/dispatch.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "cross_entropy/flce_problem.h"
#include "kernelforge/gemm.h"

namespace kernelforge {

std::string to_string(const FlcePlan& plan) {
  return "flce chunk=" + std::to_string(plan.chunk_tokens) + " vocab=" + std::to_string(plan.padded_vocab) +
         " ws=" + std::to_string(plan.workspace);
}

namespace {

// Default chunk: at most kChunkCapBytes of logits and an eighth of the [T, V] float32 logits an
// unfused loss would hold (so 4+ chunks in bf16 at any size: the extra memory stays a small share of
// the unfused one's), in multiples of kChunkAlign tokens (a GEMM tile multiple). Each chunk after the
// first costs one more read-modify-write of dweight in its GEMM (2 x 1 GB at 128256 x 4096 bf16, about
// 0.7 ms on an H100).
constexpr int64_t kChunkCapBytes = int64_t(1) << 30;
constexpr int64_t kEagerShare = 8;
constexpr int64_t kChunkAlign = 128;

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The workspace's pieces, 256-byte aligned offsets.
struct Layout {
  size_t logits = 0, wpad = 0, bpad = 0, ce = 0, scalars = 0, gemm = 0, total = 0;
};

Layout layout_of(const FlceParams& p, bool bias, int64_t chunk, int64_t vp) {
  const size_t elt = dtype_size(p.dtype);
  const bool padded = vp != p.vocab;
  Layout l;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at += align256(bytes);
    return off;
  };
  l.logits = take(size_t(chunk) * size_t(vp) * elt);
  l.wpad = take(padded ? size_t(vp) * size_t(p.hidden) * elt : 0);
  l.bpad = take(padded && bias ? size_t(vp) * elt : 0);
  l.ce = take(ce_workspace_bytes(chunk, p.vocab, p.dtype));
  l.scalars = take(4 * sizeof(float));  // the chunk's valid count, the loss gradient 1, an unused loss
  l.gemm = take(kGemmMaxWorkspace);
  l.total = at;
  return l;
}

TensorView matrix(const void* data, DType dt, Device dev, int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dt, v.device = dev, v.ndim = 2;
  v.shape[0] = rows, v.shape[1] = cols;
  v.strides[0] = s0, v.strides[1] = s1;
  return v;
}
TensorView vector(const void* data, DType dt, Device dev, int64_t n, int64_t stride) {
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dt, v.device = dev, v.ndim = 1;
  v.shape[0] = n, v.strides[0] = stride;
  return v;
}
TensorView scalar(float* data, Device dev) {
  TensorView v;
  v.data = data, v.dtype = DType::kFloat32, v.device = dev, v.ndim = 0;
  return v;
}

Status gemm_into(const TensorView& a, const TensorView& b, const TensorView* bias, const TensorView& out,
                 bool accumulate, void* ws, cudaStream_t stream) {
  GemmTensors g;
  g.a = &a, g.b = &b, g.bias = bias, g.out = &out, g.accumulate = accumulate;
  size_t bytes = kGemmMaxWorkspace;
  return gemm(g, GemmActivation::kNone, ws, &bytes, stream);
}

Status run(const char* name, bool backward, const FlcePlan& plan, const FlceTensors& t, const CrossEntropyOptions& o,
           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  FlceParams p;
  Status s = validate_flce(name, true, backward, t, o, &p);
  if (!s.ok()) return s;
  const DeviceInfo* dev = nullptr;
  if (!(s = check_device(name, t.hidden->device.index, p.dtype, &dev)).ok()) return s;
  const bool has_bias = t.bias != nullptr;
  const int64_t T = p.tokens, H = p.hidden, V = p.vocab, C = plan.chunk_tokens, Vp = plan.padded_vocab;
  const Layout l = layout_of(p, has_bias, std::max<int64_t>(C, 1), Vp);
  if (C < 1 || Vp != flce_padded_vocab(V, p.dtype) || plan.workspace != l.total)
    return Status::Invalid(std::string(name) + ": plan " + to_string(plan) +
                           " does not belong to this call (fused_linear_cross_entropy_plan)");
  if (workspace_bytes < l.total || workspace == nullptr)
    return Status::Invalid(std::string(name) + ": workspace must hold at least " + std::to_string(l.total) +
                           " bytes (fused_linear_cross_entropy_plan), got " + std::to_string(workspace_bytes));
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return Status::Invalid(std::string(name) + ": workspace must be 256-byte aligned");

  char* ws = static_cast<char*>(workspace);
  const DType dt = p.dtype;
  const size_t elt = dtype_size(dt);
  const Device device = t.hidden->device;
  const bool padded = Vp != V;
  char* logits = ws + l.logits;
  float* scal = reinterpret_cast<float*>(ws + l.scalars);
  void* gemm_ws = ws + l.gemm;

  // The weight (and bias) the GEMMs read: the caller's, or the zero-padded copy.
  const void* wdata = t.weight->data;
  int64_t ldw = p.ldw;
  const void* bdata = has_bias ? t.bias->data : nullptr;
  if (padded) {
    char* wp = ws + l.wpad;
    if (!(s = cuda_status(cudaMemcpy2DAsync(wp, size_t(H) * elt, wdata, size_t(ldw) * elt, size_t(H) * elt, size_t(V),
                                            cudaMemcpyDeviceToDevice, stream),
                          name, "copying the weight into its padded copy"))
             .ok())
      return s;
    if (!(s = cuda_status(cudaMemsetAsync(wp + size_t(V) * H * elt, 0, size_t(Vp - V) * H * elt, stream), name,
                          "zeroing the padding rows"))
             .ok())
      return s;
    wdata = wp, ldw = H;
    if (has_bias) {
      char* bp = ws + l.bpad;
      if (!(s = cuda_status(cudaMemcpyAsync(bp, bdata, size_t(V) * elt, cudaMemcpyDeviceToDevice, stream), name,
                            "copying the bias"))
               .ok())
        return s;
      if (!(s = cuda_status(cudaMemsetAsync(bp + size_t(V) * elt, 0, size_t(Vp - V) * elt, stream), name,
                            "zeroing the bias padding"))
               .ok())
        return s;
      bdata = bp;
    }
  }

  const TensorView& tg = *t.target;
  const int64_t tstride = tg.strides[0];
  if (!backward && !(s = launch_flce_count_valid(tg.data, tstride, tg.dtype == DType::kInt64, T, o.ignore_index,
                                                 static_cast<float*>(t.valid->data), &scal[1], *dev, stream))
                        .ok())
    return s;
  if (t.dbias != nullptr &&
      !(s = cuda_status(cudaMemsetAsync(t.dbias->data, 0, size_t(V) * sizeof(float), stream), name, "zeroing dbias"))
           .ok())
    return s;
  if (t.dweight != nullptr && T == 0 &&
      !(s = cuda_status(cudaMemset2DAsync(t.dweight->data, size_t(p.lddw) * elt, 0, size_t(H) * elt, size_t(V), stream),
                        name, "zeroing dweight"))
           .ok())
    return s;

  CrossEntropyOptions o_none = o;
  o_none.reduction = Reduction::kNone;
  const TensorView chunk_valid = scalar(&scal[0], device), one = scalar(&scal[1], device),
                   unused_loss = scalar(&scal[2], device);
  const TensorView wv = matrix(wdata, dt, device, Vp, H, ldw, 1);
  const TensorView wt = matrix(wdata, dt, device, H, Vp, 1, ldw);  // Wp^T, column-major
  const TensorView bv = vector(bdata, dt, device, Vp, 1);
  const size_t telt = dtype_size(tg.dtype);
  for (int64_t c0 = 0; c0 < T; c0 += C) {
    const int64_t n = std::min(C, T - c0);
    const TensorView hc =
        matrix(static_cast<const char*>(t.hidden->data) + size_t(c0 * p.ldh) * elt, dt, device, n, H, p.ldh, 1);
    const TensorView tc =
        vector(static_cast<const char*>(tg.data) + size_t(c0 * tstride) * telt, tg.dtype, device, n, tstride);
    const TensorView full = matrix(logits, dt, device, n, Vp, Vp, 1), lv = matrix(logits, dt, device, n, V, Vp, 1);
    const TensorView lse_c = vector(static_cast<float*>(t.lse->data) + c0, DType::kFloat32, device, n, 1);
    if (!(s = gemm_into(hc, wv, has_bias ? &bv : nullptr, full, false, gemm_ws, stream)).ok()) return s;
    if (!backward) {
      const TensorView row_c = vector(static_cast<float*>(t.row_loss->data) + c0, DType::kFloat32, device, n, 1);
      if (!(s = cross_entropy(lv, tc, o_none, row_c, lse_c, unused_loss, chunk_valid, ws + l.ce, l.scalars - l.ce,
                              stream))
               .ok())
        return s;
      if (!p.grads) continue;
      if (!(s = cross_entropy_backward(one, lv, tc, lse_c, *t.valid, o, lv, stream)).ok()) return s;
    } else {
      const int64_t ds = t.dloss->strides[0];
      const TensorView dloss_c =
          vector(static_cast<const float*>(t.dloss->data) + c0 * ds, DType::kFloat32, device, n, ds);
      if (!(s = cross_entropy_backward(dloss_c, lv, tc, lse_c, chunk_valid, o_none, lv, stream)).ok()) return s;
    }
    if (padded && !(s = cuda_status(cudaMemset2DAsync(logits + size_t(V) * elt, size_t(Vp) * elt, 0,
                                                      size_t(Vp - V) * elt, size_t(n), stream),
                                    name, "zeroing the padding columns"))
                       .ok())
      return s;
    if (t.dhidden != nullptr) {
      const TensorView dh =
          matrix(static_cast<char*>(t.dhidden->data) + size_t(c0 * p.lddh) * elt, dt, device, n, H, p.lddh, 1);
      if (!(s = gemm_into(full, wt, nullptr, dh, false, gemm_ws, stream)).ok()) return s;
    }
    if (t.dweight != nullptr) {
      const TensorView dlt = matrix(logits, dt, device, V, n, 1, Vp);  // dlogits[:, :V]^T
      const TensorView ht = matrix(hc.data, dt, device, H, n, 1, p.ldh);
      const TensorView dw = matrix(t.dweight->data, dt, device, V, H, p.lddw, 1);
      if (!(s = gemm_into(dlt, ht, nullptr, dw, c0 > 0, gemm_ws, stream)).ok()) return s;
    }
    if (t.dbias != nullptr) {
      s = dispatch_dtype(dt, name, [&](auto x) {
        return launch_flce_column_sum<decltype(x)>(logits, Vp, n, V, static_cast<float*>(t.dbias->data), *dev, stream);
      });
      if (!s.ok()) return s;
    }
  }
  if (!backward && o.reduction != Reduction::kNone)
    return launch_flce_loss(static_cast<const float*>(t.row_loss->data), T, static_cast<const float*>(t.valid->data),
                            o.reduction == Reduction::kMean, static_cast<float*>(t.loss->data), *dev, stream);
  return Status::Ok();
}

}  // namespace

Status fused_linear_cross_entropy_plan(const FlceTensors& t, const CrossEntropyOptions& opts, int64_t chunk_tokens,
                                       FlcePlan* plan, size_t* workspace_bytes) {
  const char* name = "fused_linear_cross_entropy_plan";
  if (plan == nullptr || workspace_bytes == nullptr)
    return Status::Invalid(std::string(name) + ": plan and workspace_bytes must not be null");
  FlceParams p;
  Status s = validate_flce(name, true, t.dloss != nullptr, t, opts, &p);
  if (!s.ok()) return s;
  if (chunk_tokens < 0) return Status::Invalid(std::string(name) + ": chunk_tokens must be >= 0 (0: the default)");
  const size_t elt = dtype_size(p.dtype);
  const int64_t T = p.tokens, V = p.vocab;
  const int64_t vp = flce_padded_vocab(V, p.dtype);
  int64_t c = chunk_tokens;
  if (c == 0) {
    const int64_t budget = std::min<int64_t>(kChunkCapBytes, std::max<int64_t>(1, T * V * 4 / kEagerShare));
    c = std::max<int64_t>(1, budget / (vp * int64_t(elt)));
    if (c >= kChunkAlign) c -= c % kChunkAlign;
  }
  c = std::max<int64_t>(1, std::min(c, std::max<int64_t>(T, 1)));
  plan->chunk_tokens = c;
  plan->padded_vocab = vp;
  plan->workspace = layout_of(p, t.bias != nullptr, c, vp).total;
  *workspace_bytes = plan->workspace;
  return Status::Ok();
}

Status fused_linear_cross_entropy(const FlcePlan& plan, const FlceTensors& t, const CrossEntropyOptions& opts,
                                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return run("fused_linear_cross_entropy", false, plan, t, opts, workspace, workspace_bytes, stream);
}

Status fused_linear_cross_entropy_backward(const FlcePlan& plan, const FlceTensors& t, const CrossEntropyOptions& opts,
                                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return run("fused_linear_cross_entropy_backward", true, plan, t, opts, workspace, workspace_bytes, stream);
}

}  // namespace kernelforge
