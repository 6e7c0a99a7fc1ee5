// kernelforge decode family: attention of the newest query tokens of each sequence against a KV
// cache (paged or contiguous), and the append of new keys and values into that cache.
//
// Tensors (element strides, as in tensor.h; every last dimension contiguous, stride 1):
//   q        [B, Lq, Hq, D]          the Lq newest tokens of each sequence: 1 for plain decoding,
//                                    2-8 to verify speculated tokens (causal among themselves)
//   k_cache  [P, page_size, Hkv, D]  v_cache: the same shape and dtype (its strides may differ)
//     paged (block_table given): key j of sequence b lives in page block_table[b, j / page_size], row
//       j % page_size; page_size is a power of two (1 .. 65536).
//     contiguous (no block_table): P >= B and sequence b lives in page b (page_size is then the cache
//       length, any value). transformers' static cache (B, Hkv, max_len, D) is k_cache.transpose(1, 2).
//   block_table int32 [B, max_pages] (any row stride, last stride 1)
//   seq_lens int32 [B]: keys in the cache for sequence b, the Lq new tokens included (append them
//     first, kv_append below). Read by the kernels only, never by the host: a CUDA graph captured
//     once replays for any new lengths.
//   out      [B, Lq, Hq, D] (q's dtype)
//   lse      optional float32 [B, Lq, Hq], natural log
//   sinks    optional per-query-head logit [Hq], float32 or q's dtype
//   key_starts optional int32 [B]: keys before key_starts[b] are invisible to sequence b (a left-padded
//     batch: the pad rows at the head of each cache). Read on the device like seq_lens; clamped to
//     [0, seq_len].
// q, caches and out share one dtype, float16 or bfloat16; math in float32. D in {64, 128, 256}.
// GQA / MQA: Hq is a multiple of Hkv; query head h reads key/value head h / (Hq / Hkv).
//
// Formula, for sequence b (n = its clamped seq_len), new token t (position i = n - Lq + t), head h:
//   key j is visible when j <= i and (window_left < 0 or j >= i - window_left) and j >= key_starts[b]
//   s_j = scale * q . k_j (scale 0: 1 / sqrt(D)); s_j = softcap * tanh(s_j / softcap) when softcap > 0
//   out = softmax over the visible j (and the sink logit sinks[h]) of s_j, times v_j; lse its log-sum
// A token that sees no key gets out = 0 (never NaN), lse = -inf (or sinks[h]).
// Bytes (the bandwidth bound): every visible key and value row is read once per kv head, 2 * n * Hkv
// * D * sizeof(T) per sequence, plus q and out.
//
// Out-of-range inputs never make a kernel read or write out of bounds: seq_lens[b] is clamped to
// [0, capacity] (capacity = max_pages * page_size, or page_size when contiguous) and a block_table
// entry outside [0, P) reads zeros (kv_append skips the row). The Python layer's check=True reports
// such inputs (it reads seq_lens and block_table on the host: a synchronization).
//
// Plan and run: decode_attention_plan() reads only shapes, strides and options (and max_seq_len, a
// host upper bound of every seq_len) and fixes the grid and the split of the keys; the run reads the
// lengths on the device. Workspace: CUB's convention, as attention.h.
//
// Workspace counters: a split plan (workspace_bytes > 0) keeps one int32 counter per (sequence, kv
// head) in the first decode_attention_counter_bytes(B, Hkv) bytes of the workspace. The CTAs of a
// (sequence, kv head) count themselves in as their partial results are stored, and the last one
// merges the splits and puts the counter back to 0. So the counters must be zero when a call starts,
// and every completed call leaves them zero: zero the workspace once when it is allocated
// (cudaMemsetAsync); it then serves any number of calls and CUDA-graph replays, with any plan of the
// same or a smaller B * Hkv, one call at a time (calls that may run at once, on different streams,
// need their own workspaces). A call with a larger B * Hkv may find its counters where an earlier
// call stored partial outputs: zero the counter bytes again first. The rest of the workspace needs no
// initial value. The PyTorch op allocates its workspace per call and zeroes the counter bytes then.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

struct DecodeOptions {
  float scale = 0.0f;        // 0: 1 / sqrt(D)
  float softcap = 0.0f;      // > 0: logits pass through softcap * tanh(s / softcap)
  int64_t window_left = -1;  // keys at most window_left before the query's position; -1: unbounded
  int64_t max_seq_len = 0;   // host upper bound of every seq_len (sizes the split); 0: the capacity
};

// The tensors of one decode_attention call; q, k_cache, v_cache, seq_lens and out are required.
struct DecodeTensors {
  const TensorView* q = nullptr;
  const TensorView* k_cache = nullptr;
  const TensorView* v_cache = nullptr;
  const TensorView* seq_lens = nullptr;
  const TensorView* block_table = nullptr;  // optional: paged cache
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;         // optional
  const TensorView* sinks = nullptr;       // optional
  const TensorView* key_starts = nullptr;  // optional int32 [B]: the first visible key of each sequence
};

// How K/V tiles reach shared memory: kCpAsync, 16-byte copies by every thread (any sm_80+ GPU, any
// page size); kTma, tensor copies issued by one producer warp (sm_90 with a 90a build, page size >= 16
// or the contiguous cache); kHeadGroup, 16-byte copies of a group of `warps` kv heads per CTA, one warp
// per head (any sm_80+ GPU; group * Lq <= 16): each token's row of those heads is one contiguous copy
// at page size 1.
enum class DecodeKernel { kCpAsync, kTma, kHeadGroup };

// A plan: one CTA per (split, row tile, kv head, sequence); its warps share each key tile (block_n
// keys, block_n / warps per warp) and merge their partial softmax states at the end; with splits > 1
// the last CTA of each (sequence, kv head) combines the splits by their logsumexp. kHeadGroup: one CTA
// per (split, group of `warps` kv heads, sequence), each warp one head's rows and all block_n = 16 keys
// of each stage; the last warp of each (sequence, kv head) combines the splits.
struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::kCpAsync;
  int head_dim = 0;
  int rows = 0;     // query rows per CTA (group * Lq rows of one kv head, in tiles of `rows`)
  int block_n = 0;  // keys per pipeline stage
  int warps = 0;    // the warps that compute (kTma adds one producer warp)
  int stages = 0;   // pipeline stages
  int splits = 1;   // key splits per (sequence, kv head, row tile)
};

// e.g. "decode d=128 rows=16 tile=64 warps=4 stages=3 splits=16",
//      "decode_tma d=128 rows=16 tile=64 warps=4+1 stages=3 splits=16",
//      "decode_heads d=128 rows=16 tile=16 heads=8 stages=2 splits=4"
std::string to_string(const DecodePlan& plan);

// The zero-initialized head of a split plan's workspace (see "Workspace counters" above): one int32 per
// (sequence, kv head), rounded up to 256 bytes.
inline size_t decode_attention_counter_bytes(int64_t batch, int64_t heads_kv) {
  return (size_t(batch) * size_t(heads_kv) * sizeof(int32_t) + 255) / 256 * 256;
}

// ---- CUDA ------------------------------------------------------------------------------------
Status decode_attention_plan(const DecodeTensors& t, const DecodeOptions& opts, DecodePlan* plan,
                             size_t* workspace_bytes);
Status decode_attention(const DecodePlan& plan, const DecodeTensors& t, const DecodeOptions& opts, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream);
Status decode_attention(const DecodeTensors& t, const DecodeOptions& opts, void* workspace, size_t* workspace_bytes,
                        cudaStream_t stream);

// kv_append: k, v [B, Lq, Hkv, D] (the caches' dtype) are written into k_cache / v_cache at the
// positions seq_lens[b] - Lq + t (seq_lens: the lengths after the append, as decode_attention takes
// them). Rows whose position falls outside [0, capacity) or whose page is out of range are skipped.
struct KvAppendTensors {
  const TensorView* k_cache = nullptr;
  const TensorView* v_cache = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* seq_lens = nullptr;
  const TensorView* block_table = nullptr;  // optional
};
Status kv_append(const KvAppendTensors& t, cudaStream_t stream);

// rope_kv_append: kv_append with the rotary embedding of the new tokens fused in, one launch. For
// token t of sequence b at position pos = seq_lens[b] - Lq + t (read on the device: CUDA-graph safe)
// the first R = rotary_dim columns of every head of q and k are rotated by row pos of the cos / sin
// tables, HF's rotate-half convention (LlamaRotaryEmbedding + apply_rotary_pos_emb), with i < R / 2,
// c = cos[pos, i], s = sin[pos, i]:
//   out[i]         = x[i] c - x[i + R/2] s
//   out[i + R/2]   = x[i + R/2] c + x[i] s
// and columns R..D-1 pass through. The rotated q goes to q_out; the rotated k and the unrotated v go
// to the cache rows of kv_append (same layouts, skip rules and seq_lens meaning); k and v are not
// written.
//   q      [B, Lq, Hq, D] (any Hq: no GQA relation is needed here)
//   q_out  q's shape and dtype: q itself (the same data pointer and strides) rotates in place,
//          otherwise it must not overlap q
//   k, v   [B, Lq, Hkv, D], caches [P, page_size, Hkv, D] as kv_append
//   cos, sin [max_pos, R]: row p holds position p; R even, 2 <= R <= D; float32 or q's dtype.
//          HF's layout (emb = cat(freqs, freqs)): both halves of a row are equal, and only the first
//          R / 2 columns are read. Tables whose halves differ are not HF's and are not supported (the
//          Python check=True reports them).
// Positions outside [0, max_pos) read row clamp(pos, 0, max_pos - 1): never out of bounds, a wrong
// rotation for a bad position (an empty slot, seq_lens 0, rotates its q by position 0 and writes no
// cache row). check=True in Python reports positions past the table.
// Math in float32, one rounding per output (bit-identical to apply_rope followed by kv_append).
// Bytes: q read and q_out written, k and v read, their cache rows written, and the first halves of
// the two table rows of each token (every head reads them; DRAM sees them once):
//   2 B Lq (Hq + 2 Hkv) D sizeof(T) + B Lq R sizeof(cos).
struct RopeKvAppendTensors {
  const TensorView* q = nullptr;
  const TensorView* q_out = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* cos = nullptr;
  const TensorView* sin = nullptr;
  const TensorView* k_cache = nullptr;
  const TensorView* v_cache = nullptr;
  const TensorView* seq_lens = nullptr;
  const TensorView* block_table = nullptr;  // optional
};
Status rope_kv_append(const RopeKvAppendTensors& t, cudaStream_t stream);

// merge_attention_states: two attention results of the same queries over disjoint key sets (the
// shared-prefix and the per-sequence pass of cascade decoding, or any split of the keys) combined by
// their logsumexp. For row n, head h (every column d):
//   m = max(lse_a, lse_b),  w_a = e^(lse_a - m),  w_b = e^(lse_b - m)
//   out = (w_a o_a + w_b o_b) / (w_a + w_b),  out_lse = m + log(w_a + w_b)
// A side whose lse is -inf (it saw no key) contributes nothing: its o is not used (it may hold NaN).
// Both -inf: out = 0, out_lse = -inf (never NaN). An lse of +inf or NaN gives NaN.
//   o_a, o_b  [N, H, D], one dtype: float16, bfloat16 or float32 (the CPU reference: float64 too);
//             any non-negative strides with the last one 1. Leading dims are flattened into N by the
//             caller (q-shaped [B, Lq, Hq, D] outputs are [B * Lq, Hq, D] views).
//   lse_a, lse_b float32 [N, H], natural log, any non-negative strides: decode_attention's lse
//             [B, Lq, Hq] is a [B * Lq, Hq] view, attention's [Hq, Tq] (varlen) or [1, Hq, Sq] (batch
//             1) is passed as its transpose.
//   out      [N, H, D] in o_a's dtype, last stride 1: o_a or o_b itself (the same data pointer and
//            strides: merged in place) or memory that overlaps none of the inputs.
//   out_lse  optional float32 [N, H], any strides; overlaps none of the inputs.
// Math in float32, out rounded once. Bytes: 3 N H D sizeof(T) (o_a and o_b read, out written) + 12 N H
// (two lse read, one written).
struct MergeStatesTensors {
  const TensorView* o_a = nullptr;
  const TensorView* lse_a = nullptr;
  const TensorView* o_b = nullptr;
  const TensorView* lse_b = nullptr;
  const TensorView* out = nullptr;
  const TensorView* out_lse = nullptr;  // optional
};
Status merge_attention_states(const MergeStatesTensors& t, cudaStream_t stream);

// prefetch_l2: asks the GPU's L2 to load the bytes [ptr, ptr + bytes) of device memory, on `stream`.
// A hint with no output: nothing is written, the call orders nothing and there is nothing to wait
// for (lines may be dropped when the memory system is busy, and later traffic evicts them as any
// other). Its use: a decode step's latency-bound kernels (RoPE, the cache append, decode attention at
// a few hundred keys) leave the DRAM idle; the next GEMM's weight prefetched on a parallel branch of
// the graph during them is then read from L2 (python/kernelforge/decode_step.py, notes/decode.md).
// sm_90: one cp.async.bulk.prefetch.L2 per 16 KB; sm_80: one prefetch.global.L2 per 128-byte line.
// ptr: device (or managed) memory, any alignment; bytes >= 0 (0: nothing is launched).
Status prefetch_l2(const void* ptr, int64_t bytes, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// The same calls on CPU tensors (float32 and float64 also accepted): double math, each output
// rounded once.
namespace ref {
Status decode_attention(const DecodeTensors& t, const DecodeOptions& opts);
Status kv_append(const KvAppendTensors& t);
Status rope_kv_append(const RopeKvAppendTensors& t);
Status merge_attention_states(const MergeStatesTensors& t);
}  // namespace ref

}  // namespace kernelforge
