// rope_kv_append's launcher: the dtype pair (q / k / v / caches: float16 or bfloat16; cos / sin:
// float32 or the same 16-bit type) dispatched once, and the widest vector every pointer and stride
// allows (16-byte rows with 8 elements per thread, else 4-byte, else 2-byte accesses; the tables'
// loads are as wide: 2 x 16 bytes for float32 with 8 elements).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/launch.cuh"
#include "decode/decode_problem.h"
#include "decode/kernels/rope_kv_append.cuh"

namespace kernelforge {

namespace {

// The vector width of a call: 8, 2 or 1 elements. The pairs' halves (R / 2 columns apart) must start
// on a vector boundary too, so R / 2 is one of the strides checked.
int rope_append_vec(const RopeKvAppendParams& p, size_t cs_size) {
  const KvAppendParams& a = p.kv;
  const uintptr_t bases = reinterpret_cast<uintptr_t>(a.k_cache) | reinterpret_cast<uintptr_t>(a.v_cache) |
                          reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v) |
                          reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.q_out);
  const int64_t strides = a.k_sp | a.k_st | a.k_sh | a.v_sp | a.v_st | a.v_sh | a.kn_sb | a.kn_st | a.kn_sh | a.vn_sb |
                          a.vn_st | a.vn_sh | p.q_sb | p.q_st | p.q_sh | p.qo_sb | p.qo_st | p.qo_sh | a.head_dim |
                          (p.rot_dim / 2);
  const uintptr_t cs_bases = reinterpret_cast<uintptr_t>(p.cos) | reinterpret_cast<uintptr_t>(p.sin);
  const int64_t cs_strides = p.cos_sp | p.sin_sp;
  auto fits = [&](int vec) {
    const uintptr_t cs_align = vec * cs_size < 16 ? vec * cs_size : 16;
    return bases % uintptr_t(2 * vec) == 0 && strides % vec == 0 && cs_bases % cs_align == 0 && cs_strides % vec == 0;
  };
  return fits(8) ? 8 : (fits(2) ? 2 : 1);
}

template <typename T, typename CS>
Status launch_typed(const RopeKvAppendParams& p, cudaStream_t stream, const DeviceInfo& dev) {
  const int vec = rope_append_vec(p, sizeof(CS));
  const int64_t threads =
      int64_t(p.kv.batch) * p.kv.q_len * (p.heads_q + 2 * int64_t(p.kv.heads_kv)) * (p.kv.head_dim / vec);
  if (threads == 0) return Status::Ok();
  const int64_t blocks = ceil_div(threads, int64_t(decode::kAppendThreads));
  const bool pdl = use_pdl(dev), trigger = pdl && blocks <= dev.sm_count;
  Launch l(dim3(unsigned(blocks)), dim3(decode::kAppendThreads), 0, stream, pdl);
  const cudaError_t err = vec == 8   ? l(decode::rope_kv_append_kernel<T, CS, 8>, p, trigger)
                          : vec == 2 ? l(decode::rope_kv_append_kernel<T, CS, 2>, p, trigger)
                                     : l(decode::rope_kv_append_kernel<T, CS, 1>, p, trigger);
  return launched(err, "rope_kv_append");
}

template <typename T>
Status launch_cs(const RopeKvAppendParams& p, DType cs_dtype, cudaStream_t stream, const DeviceInfo& dev) {
  return cs_dtype == DType::kFloat32 ? launch_typed<T, float>(p, stream, dev) : launch_typed<T, T>(p, stream, dev);
}

}  // namespace

Status launch_rope_kv_append(const RopeKvAppendParams& p, DType dtype, DType cs_dtype, cudaStream_t stream) {
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  switch (dtype) {  // validation admits only float16 / bfloat16 on CUDA
    case DType::kFloat16:
      return launch_cs<__half>(p, cs_dtype, stream, *dev);
    case DType::kBFloat16:
      return launch_cs<__nv_bfloat16>(p, cs_dtype, stream, *dev);
    default:
      return Status::Invalid(std::string("rope_kv_append: q must be float16 or bfloat16, got ") + dtype_name(dtype));
  }
}

}  // namespace kernelforge
