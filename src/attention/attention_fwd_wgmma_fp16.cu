// The wgmma attention kernel (sm_90a) instantiated for __half: head dims 64/64, 128/128, 192/128 and
// 256/256. Below sm_90a the kernels compile to an empty body and the launcher returns NotSupported.
#include "attention/attention_fwd_wgmma_launch.cuh"

namespace kernelforge {
template Status launch_attention_fwd_wgmma<__half>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
}  // namespace kernelforge
