// The one dtype dispatch: calls f(T{}) with T = float, __half or __nv_bfloat16 for the runtime
// dtype. Used once per public entry (the family's <family>.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

template <typename F>
Status dispatch_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat16:
      return f(__half{});
    case DType::kBFloat16:
      return f(__nv_bfloat16{});
    default:
      return Status::Invalid(std::string(op) + ": unsupported dtype (float32, float16 or bfloat16 expected)");
  }
}

}  // namespace kernelforge
