// Internal description of one merge_attention_states call (decode.h), shared by the CUDA launcher
// and the float64 reference. validate_merge_states() fills it from the public TensorViews and is the
// only place that checks the arguments.
//
// Addressing (element offsets): row n, head h of o_a starts at o_a + n * oa_sn + h * oa_sh (columns
// contiguous; o_b and out alike); its logsumexp is at lse_a + n * la_sn + h * la_sh (lse_b, out_lse
// alike).
#pragma once

#include <cstdint>

#include "kernelforge/decode.h"

namespace kernelforge {

struct MergeStatesParams {
  const void* o_a = nullptr;
  const void* o_b = nullptr;
  void* out = nullptr;
  const void* lse_a = nullptr;  // float32 (the CPU reference: float32 or float64, each lse its own)
  const void* lse_b = nullptr;
  void* out_lse = nullptr;  // nullptr: not written
  int64_t oa_sn = 0, oa_sh = 0;
  int64_t ob_sn = 0, ob_sh = 0;
  int64_t out_sn = 0, out_sh = 0;
  int64_t la_sn = 0, la_sh = 0;
  int64_t lb_sn = 0, lb_sh = 0;
  int64_t lo_sn = 0, lo_sh = 0;
  int64_t rows = 0;   // N
  int64_t heads = 0;  // H
  int32_t head_dim = 0;
};

// Checks every argument (cuda: the kernel's rules; otherwise the reference's, which also takes float64
// o and lse tensors) and fills `p`; `dtype` receives o_a's dtype.
Status validate_merge_states(const char* name, bool cuda, const MergeStatesTensors& t, MergeStatesParams* p,
                             DType* dtype);

// The kernel launch of a validated call on the current device (merge_states.cu).
Status launch_merge_states(const MergeStatesParams& p, DType dtype, cudaStream_t stream);

}  // namespace kernelforge
