// kernelforge MLA decode: multi-head latent attention (DeepSeek-V2 / V3) in its absorbed form, the
// newest query tokens of each sequence against a latent cache of one "head" shared by every query
// head. Part of the decode family (src/decode/, notes/decode.md): the same paging, lengths, plan /
// run split and out-of-range rules as decode_attention (decode.h).
//
// Tensors (element strides, as in tensor.h; every last dimension contiguous, stride 1):
//   q         [B, Lq, H, 576]        the Lq newest tokens (1 to 8, causal among themselves), H query
//                                    heads (1 to 128); 576 = 512 latent (W_UK absorbed) + 64 rope
//   kv_cache  [P, page_size, 576]    key j is the whole row; its value is the row's first 512 columns
//     paged (block_table given): key j of sequence b lives in page block_table[b, j / page_size], row
//       j % page_size; page_size is a power of two (1 .. 65536).
//     contiguous (no block_table): P >= B and sequence b lives in page b (page_size: the cache length).
//   block_table int32 [B, max_pages] (any row stride, last stride 1)
//   seq_lens int32 [B]: keys in the cache for sequence b, the Lq new tokens included. Read by the
//     kernels only, never by the host: a CUDA graph captured once replays for any new lengths.
//   out       [B, Lq, H, 512] (q's dtype)
//   lse       optional float32 [B, Lq, H], natural log
// q, kv_cache and out share one dtype, float16 or bfloat16; math in float32. On CUDA q and kv_cache
// start at 16-byte aligned addresses with strides that are multiples of 8 elements.
//
// Formula, for sequence b (n = its clamped seq_len), new token t (position i = n - Lq + t), head h:
//   s_j = scale * q[b, t, h, :] . kv[j, :]        for j <= i     (scale 0: 1 / sqrt(576))
//   out[b, t, h, :] = sum_j softmax(s)_j * kv[j, 0:512],  lse = log sum_j exp(s_j)
// A token that sees no key gets out = 0 (never NaN) and lse = -inf.
// Bytes (the bandwidth bound): every visible cache row once for all H heads, n * 576 * sizeof(T) per
// sequence, plus q and out. FLOPs: 2 * H * Lq * n * (576 + 512); at H = 128 about 240 per cache byte,
// so the heads are the M side of the tensor-core products (src/decode/kernels/mla_decode.cuh).
//
// Out-of-range inputs never make a kernel read or write out of bounds: seq_lens[b] is clamped to
// [0, capacity] (capacity = max_pages * page_size, or page_size when contiguous) and a block_table
// entry outside [0, P) reads zeros (a key of logit 0 and value 0), as decode_attention does.
//
// Plan and run: mla_decode_plan() reads only shapes, strides and options (and max_seq_len, a host
// upper bound of every seq_len) and fixes the grid and the split of the keys; the run reads the
// lengths on the device. Workspace: CUB's convention, as decode.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

constexpr int kMlaHeadDimK = 576;  // latent 512 + rope 64: the key and query width
constexpr int kMlaHeadDimV = 512;  // the latent part: the value and output width

struct MlaDecodeOptions {
  float scale = 0.0f;       // 0: 1 / sqrt(576)
  int64_t max_seq_len = 0;  // host upper bound of every seq_len (sizes the split); 0: the capacity
};

// The tensors of one mla_decode call; q, kv_cache, seq_lens and out are required.
struct MlaDecodeTensors {
  const TensorView* q = nullptr;
  const TensorView* kv_cache = nullptr;
  const TensorView* seq_lens = nullptr;
  const TensorView* block_table = nullptr;  // optional: paged cache
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;  // optional
};

// The kernel of a plan: the mma.sync kernel (sm_80 on; any page size), the wgmma kernel or the wgmma
// kernel's seesaw schedule (both sm_90 with the library's sm_90a image; pages of at least 16 rows, or a
// contiguous cache).
enum class MlaKernel { kMmaSync, kWgmma, kWgmmaSeesaw };

// A plan: one CTA per (row tile, split, sequence); the CTA's `rows` query rows (H * Lq rows of a
// sequence, in tiles) share each stage of block_n cache rows; with splits > 1 the decode merge kernel
// combines the splits by their logsumexp.
struct MlaDecodePlan {
  MlaKernel kernel = MlaKernel::kMmaSync;
  int rows = 0;     // query rows per CTA
  int block_n = 0;  // cache rows per pipeline stage
  int warps = 0;
  int stages = 0;  // pipeline stages (mma.sync: cp.async ring; wgmma: TMA ring)
  int splits = 1;  // key splits per (sequence, row tile)
};

// e.g. "mla_decode kernel=mma_sync rows=64 tile=32 warps=8 stages=4 splits=1"
std::string to_string(const MlaDecodePlan& plan);

// ---- CUDA (sm_80 or later) -------------------------------------------------------------------
Status mla_decode_plan(const MlaDecodeTensors& t, const MlaDecodeOptions& opts, MlaDecodePlan* plan,
                       size_t* workspace_bytes);
Status mla_decode(const MlaDecodePlan& plan, const MlaDecodeTensors& t, const MlaDecodeOptions& opts, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream);
Status mla_decode(const MlaDecodeTensors& t, const MlaDecodeOptions& opts, void* workspace, size_t* workspace_bytes,
                  cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// The same call on CPU tensors (float32 and float64 also accepted): double math, each output rounded
// once.
namespace ref {
Status mla_decode(const MlaDecodeTensors& t, const MlaDecodeOptions& opts);
}  // namespace ref

}  // namespace kernelforge
