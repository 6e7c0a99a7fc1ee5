// Formatting and comparison helpers for the argument checks of every op family (the messages name
// shapes, strides and devices the same way everywhere).
#pragma once

#include <string>

#include "kernelforge/tensor.h"

namespace kernelforge {
namespace validate_util {

inline std::string shape_str(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

inline std::string strides_str(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.strides[d]);
  return s + "]";
}

inline std::string device_str(const Device& d) {
  return d.type == DeviceType::kCUDA ? "cuda:" + std::to_string(d.index) : std::string("cpu");
}

inline bool same_shape(const TensorView& a, const TensorView& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

}  // namespace validate_util
}  // namespace kernelforge
