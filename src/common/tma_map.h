// TMA tensor maps (CUtensorMap) built on the host with cuTensorMapEncodeTiled through the runtime's
// driver entry point (no libcuda link), shared by the sm_90a kernels' launchers. The device side
// (cp.async.bulk.tensor with these maps) is common/tma.cuh.
// What TMA asks of a tensor: a 16-byte aligned base, every stride a multiple of 16 bytes below 2^40,
// extents below 2^32, and a box whose contiguous side is a multiple of 16 bytes (at most 128 bytes
// with the 128-byte swizzle).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernelforge/status.h"

namespace kernelforge {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      ptr = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

template <typename T>
constexpr CUtensorMapDataType tensor_map_type() {
  return std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A 2-D map (column, row) of 16-bit elements: `cols` contiguous columns per row, rows `row_stride`
// elements apart, boxes of box_cols x box_rows (box_cols * 2 bytes = 128 with the 128-byte swizzle),
// zero fill outside the tensor. A single row's stride is never used: any legal value is passed.
template <typename T>
Status encode_tensor_map_2d(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t row_stride,
                            int box_cols, int box_rows, CUtensorMapSwizzle swizzle, const char* what, const char* who) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr)
    return Status::NotSupported(std::string(who) + ": the driver has no cuTensorMapEncodeTiled (CUDA 12 or newer)");
  const cuuint64_t row_bytes = rows == 1 ? (cuuint64_t(cols) * 2 + 15) / 16 * 16 : cuuint64_t(row_stride) * 2;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || row_bytes % 16 != 0 || row_bytes >= (cuuint64_t(1) << 40))
    return Status::NotSupported(std::string(who) + ": TMA needs " + what +
                                " 16-byte aligned with a row stride of a multiple of 16 bytes");
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, tensor_map_type<T>(), 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Cuda(std::string(who) + ": cuTensorMapEncodeTiled(" + what + ") failed with CUresult " +
                        std::to_string(int(r)));
  return Status::Ok();
}

}  // namespace kernelforge
