// Argument checks of the linear family: every message names the entry and the argument.
#include <cstdint>
#include <string>

#include "common/validate_util.h"
#include "linear/linear_problem.h"

namespace kernelforge {

namespace {

using validate_util::shape_str;
using validate_util::strides_str;

}  // namespace

Status validate_linear(const char* name, bool cuda, const LinearTensors& t, LinearParams* p, DType* dtype) {
  auto fail = [&](const std::string& m) { return Status::Invalid(std::string(name) + ": " + m); };
  if (t.x == nullptr || t.w == nullptr || t.y == nullptr) return fail("x, w and y must not be null");
  const TensorView &x = *t.x, &w = *t.w, &y = *t.y;
  auto basic = [&](const TensorView& v, const char* arg, int ndim, const char* form) -> Status {
    std::string e = validate_util::rank_error(v, arg, ndim, form);
    if (e.empty()) e = validate_util::strided_view_error(v, arg);
    if (e.empty()) e = validate_util::placement_error(v, arg, x, "x", cuda);
    return e.empty() ? Status::Ok() : fail(e);
  };
  Status s = basic(x, "x", 2, "[M, K]");
  if (!s.ok()) return s;
  const bool half = x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16;
  const bool wide = x.dtype == DType::kFloat32 || x.dtype == DType::kFloat64;
  if (!(half || (!cuda && wide)))
    return fail(std::string("x must be float16 or bfloat16") + (cuda ? "" : " (float32 / float64 on CPU)") + ", got " +
                dtype_name(x.dtype));
  if (!(s = basic(w, "w", 2, "[N, K]")).ok()) return s;
  if (w.shape[1] != x.shape[1])
    return fail("w must have x's K = " + std::to_string(x.shape[1]) + " columns ([N, K]), got shape " + shape_str(w));
  if (!(s = basic(y, "y", 2, "[M, N]")).ok()) return s;
  if (y.shape[0] != x.shape[0] || y.shape[1] != w.shape[0])
    return fail("y must have shape [" + std::to_string(x.shape[0]) + ", " + std::to_string(w.shape[0]) + "], got " +
                shape_str(y));
  if (t.bias != nullptr) {
    if (!(s = basic(*t.bias, "bias", 1, "[N]")).ok()) return s;
    if (t.bias->shape[0] != w.shape[0])
      return fail("bias must have shape [" + std::to_string(w.shape[0]) + "] (one per output column), got " +
                  shape_str(*t.bias));
    if (w.shape[0] > 1 && t.bias->strides[0] != 1)
      return fail("bias must be contiguous, got strides " + strides_str(*t.bias));
  }
  if (cuda && x.shape[0] > kLinearMaxRows)
    return Status::NotSupported(std::string(name) + ": x has " + std::to_string(x.shape[0]) +
                                " rows; the skinny kernels take at most " + std::to_string(kLinearMaxRows) +
                                " (larger M is a GEMM: torch / cuBLAS)");
  if (y.numel() > 1 && y.shape[0] > 1 && y.shape[1] > 0 && y.strides[0] < y.shape[1])
    return fail("y's rows overlap (row stride " + std::to_string(y.strides[0]) +
                " < N = " + std::to_string(y.shape[1]) + ")");
  p->x = x.data;
  p->w = w.data;
  p->bias = t.bias != nullptr ? t.bias->data : nullptr;
  p->y = y.data;
  p->ldx = x.shape[0] > 1 ? x.strides[0] : x.shape[1];
  p->ldw = w.shape[0] > 1 ? w.strides[0] : w.shape[1];
  p->ldy = y.shape[0] > 1 ? y.strides[0] : y.shape[1];
  p->M = int32_t(x.shape[0] > INT32_MAX ? INT32_MAX : x.shape[0]);
  p->N = w.shape[0];
  p->K = x.shape[1];
  p->vec16 = reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
             (p->ldx | p->ldw) % 8 == 0;
  p->tma = reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
           (p->M <= 1 || (p->ldx % 8 == 0 && p->ldx >= p->K)) && (p->N <= 1 || (p->ldw % 8 == 0 && p->ldw >= p->K)) &&
           p->K >= 8 && p->K <= INT32_MAX && p->N <= INT32_MAX;
  p->gemv = p->M <= kLinearGemvMaxRows && p->K % 8 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && p->ldw % 8 == 0 && (p->M <= 1 || p->ldx % 8 == 0);
  *dtype = x.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
