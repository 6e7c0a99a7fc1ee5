// kernelforge tensor view: a non-owning description of a strided tensor.
// Framework-free: no torch header is included anywhere under include/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace kernelforge {

enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kOther = 6,  // any dtype the library does not know (bool, int8, complex, ...)
};

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; ignored for CPU
};

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    default:
      return "unsupported dtype";
  }
}

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    default:
      return 0;
  }
}

constexpr int kMaxDims = 8;

// shape and strides are in elements (not bytes), as in PyTorch. A view with ndim == 0 is a scalar.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  Device device = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  // Python-style index: size(-1) is the last dimension.
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
};

// Builds a view of a contiguous (row-major) tensor.
inline TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            Device device = {DeviceType::kCUDA, 0}) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) v.shape[d++] = s;
  int64_t stride = 1;
  for (d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

}  // namespace kernelforge
