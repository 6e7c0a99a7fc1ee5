// Formatting and comparison helpers for the argument checks of every op family (the messages name
// shapes, strides and devices the same way everywhere).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

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

// Row stride of a [..., N] view: its last dimension must be contiguous and its leading dimensions
// must collapse into one stride (rows equally spaced). Sets *row_stride and returns "", or returns
// why not, worded to follow the argument's name in an error message. Empty views take any strides.
inline std::string collapse_rows(const TensorView& t, int64_t* row_stride) {
  const int nd = t.ndim;
  const int64_t n = t.shape[nd - 1];
  if (t.numel() == 0) {  // nothing is read or written: any strides are fine
    *row_stride = n;
    return "";
  }
  if (n > 1 && t.strides[nd - 1] != 1)
    return " must be contiguous in its last dimension (stride 1), got stride " + std::to_string(t.strides[nd - 1]);
  // Walking inwards, each non-trivial dim's stride must equal the next non-trivial dim's stride
  // times that dim's size.
  int64_t stride = n;  // used when there is at most one row
  int64_t expect = -1;
  for (int d = nd - 2; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (expect < 0) {
      stride = t.strides[d];
    } else if (t.strides[d] != expect) {
      return " must have leading dimensions that collapse into one row stride (shape " + shape_str(t) + ", strides " +
             strides_str(t) + "); make it contiguous first";
    }
    expect = t.strides[d] * t.shape[d];
  }
  if (stride < 0) return " must not have negative strides";
  *row_stride = stride;
  return "";
}

// A strided view's elementwise layout: no negative size or stride, a contiguous last dimension and a
// data pointer when it holds elements. "" when it holds; otherwise the message, starting with `name`.
inline std::string strided_view_error(const TensorView& t, const char* name) {
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) return std::string(name) + " has a negative size " + shape_str(t);
    if (t.strides[d] < 0) return std::string(name) + " must not have negative strides, got " + strides_str(t);
  }
  if (t.numel() > 0 && t.size(-1) > 1 && t.stride(-1) != 1)
    return std::string(name) + " must be contiguous in its last dimension (stride 1), got stride " +
           std::to_string(t.stride(-1));
  if (t.numel() > 0 && t.data == nullptr) return std::string(name) + " has a null data pointer";
  return "";
}

// An operand's rank, then its place next to the call's first tensor `ref` (named `ref_name`): the same
// device (a CUDA one when `cuda`) and dtype. "" when it holds; otherwise the message, starting with `name`.
inline std::string rank_error(const TensorView& t, const char* name, int ndim, const char* form) {
  if (t.ndim == ndim) return "";
  return std::string(name) + " must have " + std::to_string(ndim) + (ndim == 1 ? " dimension " : " dimensions ") +
         form + ", got " + std::to_string(t.ndim) + " dimensions " + shape_str(t);
}
inline std::string placement_error(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name,
                                   bool cuda) {
  const bool same =
      t.device.type == ref.device.type && (ref.device.type != DeviceType::kCUDA || t.device.index == ref.device.index);
  if (!same)
    return std::string(name) + " must be on " + ref_name + "'s device (" + device_str(ref.device) + "), got " +
           device_str(t.device);
  if (cuda && t.device.type != DeviceType::kCUDA)
    return std::string(name) + " must be a CUDA tensor, got " + device_str(t.device);
  if (t.dtype != ref.dtype)
    return std::string(name) + " must have " + ref_name + "'s dtype (" + dtype_name(ref.dtype) + "), got " +
           dtype_name(t.dtype);
  return "";
}

// Bytes spanned by a view: [data, data + extent) (non-negative strides).
inline int64_t extent_bytes(const TensorView& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.strides[d];
  return (last + 1) * int64_t(dtype_size(t.dtype));
}

// Whether the byte ranges of two non-empty views intersect.
inline bool ranges_overlap(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return pa < pb + extent_bytes(b) && pb < pa + extent_bytes(a);
}

// True when no two elements of the view share an address (sufficient test: with the dimensions of
// size > 1 sorted by stride, each stride exceeds the span of the dimensions inside it).
inline bool non_overlapping(const TensorView& t) {
  if (t.numel() <= 1) return true;
  int order[kMaxDims];
  int n = 0;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) order[n++] = d;
  for (int i = 1; i < n; ++i)  // insertion sort by stride (std::sort on int[8] trips GCC 12's -Warray-bounds)
    for (int j = i; j > 0 && t.strides[order[j]] < t.strides[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
  int64_t span = 0;  // largest offset reachable with the inner dimensions
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    if (t.strides[d] <= span) return false;
    span += (t.shape[d] - 1) * t.strides[d];
  }
  return true;
}

}  // namespace validate_util
}  // namespace kernelforge
