// Argument-check helpers shared by the forward's and the backward's validation
// (attention_validate.cpp, attention_validate_bwd.cpp): memory-range and overlap tests, the
// size-1-stride convention of the params, and the Checker that words every error message.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "attention/attention_problem.h"
#include "common/validate_util.h"

namespace kernelforge {
namespace attention_validate {

inline std::string dims(std::initializer_list<int64_t> v) {
  std::string s = "[";
  int i = 0;
  for (int64_t x : v) s += (i++ ? ", " : "") + std::to_string(x);
  return s + "]";
}

using validate_util::extent_bytes;
using validate_util::non_overlapping;
using validate_util::ranges_overlap;

// True when two views whose byte ranges interleave are still disjoint because they are slices of
// one parent view along one dimension d: the same dtype and strides, the same sizes except in d, b
// starting m steps of d past a (m integral), the index ranges [0, a.shape[d]) and [m, m + b.shape[d])
// disjoint, and the parent (d spanning both) free of self-overlap, so distinct indices are distinct
// addresses. Covers the q / k / v (or dq / dk / dv) heads of one fused buffer.
inline bool disjoint_slices(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim) return false;
  const int64_t es = int64_t(dtype_size(a.dtype));
  const int64_t delta_bytes = static_cast<const char*>(b.data) - static_cast<const char*>(a.data);
  if (delta_bytes % es != 0) return false;
  const int64_t delta = delta_bytes / es;
  for (int d = 0; d < a.ndim; ++d) {
    bool same = true;
    for (int e = 0; e < a.ndim; ++e)
      same = same && a.strides[e] == b.strides[e] && (e == d || a.shape[e] == b.shape[e]);
    if (!same || a.strides[d] <= 0 || delta % a.strides[d] != 0) continue;
    const int64_t m = delta / a.strides[d];
    if (m < a.shape[d] && m + b.shape[d] > 0) continue;  // the index ranges intersect
    TensorView parent = m >= 0 ? a : b;
    parent.shape[d] = m >= 0 ? m + b.shape[d] : a.shape[d] - m;
    if (non_overlapping(parent)) return true;
  }
  return false;
}

// Whether two views may share an address: their byte ranges intersect and they are not disjoint
// slices of one parent.
inline bool may_overlap(const TensorView& a, const TensorView& b) {
  return ranges_overlap(a, b) && !disjoint_slices(a, b);
}

// Stride of dimension d, 0 when the dimension has size 1 (its index is always 0; PyTorch may give
// it any stride, which would otherwise needlessly rule out 16-byte loads and TMA).
inline int64_t stride_or_0(const TensorView& t, int d) { return t.shape[d] == 1 ? 0 : t.strides[d]; }

// Words the errors of one call: "<entry>: <argument> must ...".
struct Checker {
  const char* name;
  const AttentionTensors& t;  // the forward's tensors: the inputs outputs must not overlap
  const TensorView* q = nullptr;
  Checker(const char* entry, const AttentionTensors& tensors) : name(entry), t(tensors) {}

  Status fail(const std::string& m) const { return Status::Invalid(std::string(name) + ": " + m); }

  Status same_device_as_q(const TensorView& x, const char* arg) const {
    const bool same =
        x.device.type == q->device.type && (q->device.type != DeviceType::kCUDA || x.device.index == q->device.index);
    if (!same)
      return fail(std::string(arg) + " must be on the same device as q (" + validate_util::device_str(q->device) +
                  "), got " + validate_util::device_str(x.device));
    return Status::Ok();
  }

  // Rank, sizes, unit last stride, non-negative strides, non-null data.
  Status basic(const TensorView& x, const char* arg, int ndim, const char* shape_desc) const {
    if (x.ndim != ndim)
      return fail(std::string(arg) + " must have " + std::to_string(ndim) +
                  (ndim == 1 ? " dimension " : " dimensions ") + shape_desc + ", got " + std::to_string(x.ndim) +
                  " dimensions " + validate_util::shape_str(x));
    const std::string layout = validate_util::strided_view_error(x, arg);
    return layout.empty() ? Status::Ok() : fail(layout);
  }

  Status expect_shape(const TensorView& x, const char* arg, std::initializer_list<int64_t> want,
                      const std::string& why) const {
    bool same = int(want.size()) == x.ndim;
    int d = 0;
    for (int64_t w : want) same = same && x.shape[d++] == w;
    if (!same)
      return fail(std::string(arg) + " must have shape " + dims(want) + " " + why + ", got " +
                  validate_util::shape_str(x));
    return Status::Ok();
  }

  // An output whose elements must not alias each other nor any of q, k, v.
  Status no_alias(const TensorView& o, const char* arg) const {
    if (!non_overlapping(o))
      return fail(std::string(arg) + " has overlapping elements (shape " + validate_util::shape_str(o) + ", strides " +
                  validate_util::strides_str(o) + "): outputs would race");
    const std::pair<const TensorView*, const char*> inputs[] = {{t.q, "q"}, {t.k, "k"}, {t.v, "v"}};
    for (const auto& in : inputs)
      if (ranges_overlap(o, *in.first))
        return fail(std::string(arg) + " must not overlap " + in.second + " (attention does not run in place)");
    return Status::Ok();
  }
};

}  // namespace attention_validate
}  // namespace kernelforge
