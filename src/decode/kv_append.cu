// kv_append's launcher: the widest copy every pointer and stride allows (16-byte, 4-byte or
// 2-byte words; the kernel copies bits, so one instantiation serves every 16-bit dtype).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/device.h"
#include "common/launch.cuh"
#include "decode/decode_problem.h"
#include "decode/kernels/kv_append.cuh"

namespace kernelforge {

Status launch_kv_append(const KvAppendParams& p, cudaStream_t stream) {
  const uintptr_t bases = reinterpret_cast<uintptr_t>(p.k_cache) | reinterpret_cast<uintptr_t>(p.v_cache) |
                          reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v);
  const int64_t strides = p.k_sp | p.k_st | p.k_sh | p.v_sp | p.v_st | p.v_sh | p.kn_sb | p.kn_st | p.kn_sh | p.vn_sb |
                          p.vn_st | p.vn_sh | p.head_dim;
  const int vec = (bases % 16 == 0 && strides % 8 == 0) ? 8 : ((bases % 4 == 0 && strides % 2 == 0) ? 2 : 1);
  const int64_t threads = int64_t(p.batch) * p.q_len * p.heads_kv * (p.head_dim / vec);
  if (threads == 0) return Status::Ok();
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  const int64_t blocks = ceil_div(threads, int64_t(decode::kAppendThreads));
  const bool pdl = use_pdl(*dev), trigger = pdl && blocks <= dev->sm_count;
  Launch l(dim3(unsigned(blocks)), dim3(decode::kAppendThreads), 0, stream, pdl);
  cudaError_t err =
      vec == 8 ? l(decode::kv_append_kernel<8>, p, trigger)
               : (vec == 2 ? l(decode::kv_append_kernel<2>, p, trigger) : l(decode::kv_append_kernel<1>, p, trigger));
  return launched(err, "kv_append");
}

}  // namespace kernelforge
