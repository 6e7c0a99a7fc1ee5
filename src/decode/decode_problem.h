// Internal description of one decode call (decode_attention, kv_append, rope_kv_append), shared by the
// CUDA launchers and the float64 reference. validate_decode() / validate_kv_append() /
// validate_rope_kv_append() fill it from the public TensorViews; they are the only places that check
// arguments.
//
// Addressing (element offsets): token t, head h of sequence b of q is at q + b * q_sb + t * q_st +
// h * q_sh (columns contiguous; out and lse alike). Key j of kv head h of sequence b is at
//   k_cache + page * k_sp + (j % page_size) * k_st + h * k_sh,
//   page = block_table[b * bt_sb + j / page_size] (paged) or b (contiguous).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/decode.h"
#include "kernelforge/mla.h"

namespace kernelforge {

struct DecodeParams {
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  void* out = nullptr;
  float* lse = nullptr;         // nullptr: not written
  const void* sinks = nullptr;  // nullptr: no sinks; else [Hq] of float32 (sinks_float) or q's dtype
  bool sinks_float = true;
  const int32_t* seq_lens = nullptr;
  const int32_t* block_table = nullptr;  // nullptr: contiguous cache
  const int32_t* key_starts = nullptr;   // nullptr: every sequence's keys start at 0
  int64_t q_sb = 0, q_st = 0, q_sh = 0;
  int64_t o_sb = 0, o_st = 0, o_sh = 0;
  int64_t lse_sb = 0, lse_st = 0;  // lse [B, Lq, Hq], head stride 1
  int64_t k_sp = 0, k_st = 0, k_sh = 0;
  int64_t v_sp = 0, v_st = 0, v_sh = 0;
  int64_t bt_sb = 0;
  int32_t batch = 0;
  int32_t q_len = 0;
  int32_t heads_q = 0;
  int32_t heads_kv = 0;
  int32_t group = 1;  // heads_q / heads_kv
  int32_t rows = 0;   // group * q_len: the query rows of one (sequence, kv head)
  int32_t head_dim = 0;
  int32_t pages = 0;       // P: pages in the cache
  int32_t page_size = 0;   // paged: a power of two; contiguous: the cache length
  int32_t page_shift = 0;  // log2(page_size) when paged
  int32_t max_pages = 0;   // block_table columns (paged)
  int32_t capacity = 0;    // keys a sequence can hold: max_pages * page_size, or page_size
  float scale = 1.0f;
  float softcap = 0.0f;
  int32_t window_left = -1;
  int64_t max_seq_len = 0;  // host upper bound of seq_lens (<= capacity), for the plan
};

struct DecodeCall {
  const char* name = "decode_attention";
  bool cuda = true;  // false: the CPU reference (float32 / float64 also accepted)
  DecodeTensors t;
  DecodeOptions opts;
};

// Checks every argument of `c` and fills `p`; `dtype` receives q's dtype.
Status validate_decode(const DecodeCall& c, DecodeParams* p, DType* dtype);

// mla_decode (mla.h) in DecodeParams terms: one kv head whose keys are the whole 576-column rows of
// kv_cache and whose values are their first 512 columns (k_cache == v_cache, same strides); group = H,
// head_dim = 576, no window, softcap or sinks.
struct MlaDecodeCall {
  const char* name = "mla_decode";
  bool cuda = true;  // false: the CPU reference (float32 / float64 also accepted)
  MlaDecodeTensors t;
  MlaDecodeOptions opts;
};
Status validate_mla_decode(const MlaDecodeCall& c, DecodeParams* p, DType* dtype);

// The key split of a decode-family plan (decode_plan.cpp): for each split count s, the CTA waves
// (s * base_ctas over `slots` resident CTAs) times the key tiles per CTA plus a fixed cost per CTA, and
// the merge pass when s > 1; the smallest cost wins, the smaller s on ties. Splits hold at least
// min_split_keys keys and number at most max_splits.
struct SplitCost {
  int64_t min_split_keys;  // shorter splits are all overhead
  int64_t cta_overhead;    // per CTA, in key-tile times
  int64_t merge;           // the split merge (MLA: a second kernel; decode: the last CTA), in key-tile times
  int64_t max_splits;
};
int split_keys(int64_t base_ctas, int64_t slots, int64_t keys, int64_t block_n, const SplitCost& cost);

// A plan's workspace against what the call passes: an error naming the entry and the plan, or Ok.
Status check_decode_workspace(const char* name, const std::string& plan, size_t need, const void* workspace,
                              size_t bytes);

struct KvAppendParams {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* block_table = nullptr;
  int64_t k_sp = 0, k_st = 0, k_sh = 0;
  int64_t v_sp = 0, v_st = 0, v_sh = 0;
  int64_t kn_sb = 0, kn_st = 0, kn_sh = 0;  // new k [B, Lq, Hkv, D]
  int64_t vn_sb = 0, vn_st = 0, vn_sh = 0;
  int64_t bt_sb = 0;
  int32_t batch = 0;
  int32_t q_len = 0;
  int32_t heads_kv = 0;
  int32_t head_dim = 0;
  int32_t pages = 0;
  int32_t page_size = 0;
  int32_t page_shift = 0;
  int32_t max_pages = 0;
  int32_t capacity = 0;
};

Status validate_kv_append(const char* name, bool cuda, const KvAppendTensors& t, KvAppendParams* p, DType* dtype);

// rope_kv_append (decode.h): kv_append's fields for k, v and the caches, plus q, q_out and the cos / sin
// tables. Token t, head h of q is at q + b * q_sb + t * q_st + h * q_sh (q_out alike); position p's
// table values at cos + p * cos_sp (columns 0 .. rot_dim / 2 - 1 are read).
struct RopeKvAppendParams {
  KvAppendParams kv;
  const void* q = nullptr;
  void* q_out = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t q_sb = 0, q_st = 0, q_sh = 0;
  int64_t qo_sb = 0, qo_st = 0, qo_sh = 0;
  int64_t cos_sp = 0, sin_sp = 0;
  int32_t heads_q = 0;
  int32_t max_pos = 0;     // table rows (>= 1)
  int32_t rot_dim = 0;     // R: even, 2 .. head_dim
  bool q_inplace = false;  // q_out is q: the passthrough columns are not copied
};

// Fills `p`; `dtype` receives q's dtype, `cs_dtype` the tables'.
Status validate_rope_kv_append(const char* name, bool cuda, const RopeKvAppendTensors& t, RopeKvAppendParams* p,
                               DType* dtype, DType* cs_dtype);

}  // namespace kernelforge
