// merge_attention_states' launcher: the dtype dispatched once, and 16-byte vectors when every base
// pointer, row / head stride and the head dim allow them (else one element per thread).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/dispatch.h"
#include "common/launch.cuh"
#include "decode/kernels/merge_states.cuh"
#include "decode/merge_states.h"

namespace kernelforge {

namespace {

template <typename T, int kVec>
cudaError_t launch_vec(const MergeStatesParams& p, cudaStream_t stream, const DeviceInfo& dev) {
  const int64_t threads = p.rows * p.heads * (p.head_dim / kVec);
  Launch l(dim3(unsigned(ceil_div(threads, int64_t(decode::kMergeStatesThreads)))), dim3(decode::kMergeStatesThreads),
           0, stream, use_pdl(dev));
  return l(decode::merge_states_kernel<T, kVec>, p);
}

}  // namespace

Status launch_merge_states(const MergeStatesParams& p, DType dtype, cudaStream_t stream) {
  if (p.rows == 0 || p.heads == 0 || p.head_dim == 0) return Status::Ok();
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  return dispatch_dtype(dtype, "merge_attention_states", [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int kVec = int(16 / sizeof(T));
    const uintptr_t bases =
        reinterpret_cast<uintptr_t>(p.o_a) | reinterpret_cast<uintptr_t>(p.o_b) | reinterpret_cast<uintptr_t>(p.out);
    const int64_t strides = p.oa_sn | p.oa_sh | p.ob_sn | p.ob_sh | p.out_sn | p.out_sh | p.head_dim;
    const bool wide = bases % 16 == 0 && strides % kVec == 0;
    const cudaError_t err = wide ? launch_vec<T, kVec>(p, stream, *dev) : launch_vec<T, 1>(p, stream, *dev);
    return launched(err, "merge_attention_states");
  });
}

}  // namespace kernelforge
