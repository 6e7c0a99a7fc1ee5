// TMA tensor maps of the wgmma attention kernels (forward and backward), encoded with
// common/tma_map.h's cuTensorMapEncodeTiled entry point. Every map is 4-D
// (column, row, head, batch) over 16-bit elements, boxes of 64 columns (128 bytes, the swizzle span),
// 128-byte swizzle, zero fill outside the tensor.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/tma_map.h"
#include "kernelforge/status.h"

namespace kernelforge {

// A 4-D map (column, row, head, batch) of 16-bit elements: boxes of 64 columns x box_rows rows, 128-byte
// swizzle, zero fill outside. Strides in elements; a stride of an extent-1 dimension is never used.
template <typename T>
Status encode_attention_map(CUtensorMap* map, const void* base, int cols, int64_t rows, int64_t heads, int64_t batch,
                            int64_t s_row, int64_t s_head, int64_t s_batch, int box_rows, const char* what,
                            const char* who) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr)
    return Status::NotSupported(std::string(who) + ": the driver has no cuTensorMapEncodeTiled (CUDA 12 or newer)");
  auto bytes = [](int64_t stride, int64_t extent) -> cuuint64_t {
    return extent == 1 ? cuuint64_t(16) : cuuint64_t(stride) * sizeof(T);
  };
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {bytes(s_row, rows), bytes(s_head, heads), bytes(s_batch, batch)};
  for (cuuint64_t s : strides)
    if (s % 16 != 0 || s >= (cuuint64_t(1) << 40) || s == 0)
      return Status::NotSupported(std::string(who) + ": the wgmma kernel needs 16-byte multiples as the " + what +
                                  " strides");
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return Status::NotSupported(std::string(who) + ": the wgmma kernel needs " + what + " 16-byte aligned");
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = tensor_map_type<T>();
  const CUresult r =
      encode(map, type, 4, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Cuda(std::string(who) + ": cuTensorMapEncodeTiled(" + what + ") failed with CUresult " +
                        std::to_string(int(r)));
  return Status::Ok();
}

// The backward's float32 dQ accumulator [heads][rows][cols] as a 3-D map (column, row, head): boxes of
// 32 columns (128 bytes) x box_rows rows, 128-byte swizzle; the target of TMA reduce-adds.
inline Status encode_dq_acc_map(CUtensorMap* map, const float* base, int cols, int64_t rows, int64_t heads,
                                int box_rows, const char* who) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr)
    return Status::NotSupported(std::string(who) + ": the driver has no cuTensorMapEncodeTiled (CUDA 12 or newer)");
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads)};
  const cuuint64_t strides[2] = {cuuint64_t(cols) * 4, heads == 1 ? cuuint64_t(16) : cuuint64_t(rows) * cols * 4};
  const cuuint32_t box[3] = {32, cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Cuda(std::string(who) + ": cuTensorMapEncodeTiled(dq accumulator) failed with CUresult " +
                        std::to_string(int(r)));
  return Status::Ok();
}

}  // namespace kernelforge
