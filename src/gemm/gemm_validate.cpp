// Argument checks of the GEMM family: every message names the entry and the argument.
#include <cstdint>
#include <string>

#include "common/validate_util.h"
#include "gemm/gemm_problem.h"

namespace kernelforge {

namespace {

using validate_util::shape_str;
using validate_util::strides_str;

}  // namespace

const char* to_string(GemmActivation act) {
  switch (act) {
    case GemmActivation::kNone:
      return "none";
    case GemmActivation::kRelu:
      return "relu";
    case GemmActivation::kGeluTanh:
      return "gelu_tanh";
  }
  return "?";
}

Status validate_gemm(const char* name, bool cuda, const GemmTensors& t, GemmActivation act, GemmParams* p,
                     DType* dtype) {
  auto fail = [&](const std::string& m) { return Status::Invalid(std::string(name) + ": " + m); };
  if (t.a == nullptr || t.b == nullptr || t.out == nullptr) return fail("a, b and out must not be null");
  if (act != GemmActivation::kNone && act != GemmActivation::kRelu && act != GemmActivation::kGeluTanh)
    return fail("activation must be none, relu or gelu_tanh");
  const TensorView &a = *t.a, &b = *t.b, &out = *t.out;
  auto basic = [&](const TensorView& v, const char* arg, int ndim, const char* form) -> Status {
    std::string e = validate_util::rank_error(v, arg, ndim, form);
    for (int d = 0; d < v.ndim && e.empty(); ++d) {
      if (v.shape[d] < 0) e = std::string(arg) + " has a negative size " + shape_str(v);
      if (v.strides[d] < 0) e = std::string(arg) + " must not have negative strides, got " + strides_str(v);
    }
    if (e.empty() && v.numel() > 0 && v.data == nullptr) e = std::string(arg) + " has a null data pointer";
    if (e.empty()) e = validate_util::placement_error(v, arg, a, "a", cuda);
    return e.empty() ? Status::Ok() : fail(e);
  };
  // A [rows, cols] operand: row-major (stride 1 along cols) or column-major (stride 1 along rows). A view
  // that is both (a single row or column) takes `prefer_col`'s reading: cuBLASLt's bias-gradient
  // epilogue (a_sum) wants a column-major a.
  auto operand = [&](const TensorView& v, const char* arg, bool prefer_col, GemmMatrix* m) -> Status {
    const int64_t rows = v.shape[0], cols = v.shape[1];
    const bool row_ok = cols <= 1 || v.strides[1] == 1, col_ok = rows <= 1 || v.strides[0] == 1;
    m->data = v.data;
    if (row_ok && !(prefer_col && col_ok)) {
      m->row_major = true;
      m->ld = rows > 1 ? v.strides[0] : (cols > 0 ? cols : 1);
      if (rows > 1 && cols > 0 && m->ld < cols)
        return fail(std::string(arg) + "'s rows overlap (row stride " + std::to_string(m->ld) + " < " +
                    std::to_string(cols) + " columns)");
      return Status::Ok();
    }
    if (col_ok) {
      m->row_major = false;
      m->ld = cols > 1 ? v.strides[1] : (rows > 0 ? rows : 1);
      if (cols > 1 && rows > 0 && m->ld < rows)
        return fail(std::string(arg) + "'s columns overlap (column stride " + std::to_string(m->ld) + " < " +
                    std::to_string(rows) + " rows)");
      return Status::Ok();
    }
    return fail(std::string(arg) + " must be row-major or column-major (stride 1 along one dimension), got strides " +
                strides_str(v));
  };
  Status s = basic(a, "a", 2, "[M, K]");
  if (!s.ok()) return s;
  const bool half = a.dtype == DType::kFloat16 || a.dtype == DType::kBFloat16;
  const bool wide = a.dtype == DType::kFloat32 || a.dtype == DType::kFloat64;
  if (!(half || (!cuda && wide)))
    return fail(std::string("a must be float16 or bfloat16") + (cuda ? "" : " (float32 / float64 on CPU)") + ", got " +
                dtype_name(a.dtype));
  if (!(s = basic(b, "b", 2, "[N, K]")).ok()) return s;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[0];
  if (b.shape[1] != K)
    return fail("b must have a's K = " + std::to_string(K) + " columns ([N, K]), got shape " + shape_str(b));
  if (!(s = basic(out, "out", 2, "[M, N]")).ok()) return s;
  if (out.shape[0] != M || out.shape[1] != N)
    return fail("out must have shape [" + std::to_string(M) + ", " + std::to_string(N) + "], got " + shape_str(out));
  if (N > 1 && out.strides[1] != 1 && M > 0)
    return fail("out must be row-major (stride 1 along N), got strides " + strides_str(out));
  const int64_t ldo = M > 1 ? out.strides[0] : (N > 0 ? N : 1);
  if (M > 1 && N > 0 && ldo < N)
    return fail("out's rows overlap (row stride " + std::to_string(ldo) + " < N = " + std::to_string(N) + ")");
  if (!(s = operand(a, "a", t.a_sum != nullptr, &p->a)).ok()) return s;
  if (!(s = operand(b, "b", false, &p->b)).ok()) return s;
  auto vector = [&](const TensorView* v, const char* arg, int64_t n, const char* what) -> Status {
    if (v == nullptr) return Status::Ok();
    Status st = basic(*v, arg, 1, what);
    if (!st.ok()) return st;
    if (v->shape[0] != n)
      return fail(std::string(arg) + " must have shape [" + std::to_string(n) + "], got " + shape_str(*v));
    if (n > 1 && v->strides[0] != 1)
      return fail(std::string(arg) + " must be contiguous, got strides " + strides_str(*v));
    return Status::Ok();
  };
  if (!(s = vector(t.bias, "bias", N, "[N]")).ok()) return s;
  if (!(s = vector(t.a_sum, "a_sum", M, "[M]")).ok()) return s;
  if (t.aux != nullptr) {
    if (act != GemmActivation::kGeluTanh)
      return fail(std::string("aux (the pre-activation for the backward) goes with activation gelu_tanh, got ") +
                  to_string(act) + " (relu's backward reads out > 0)");
    if (!(s = basic(*t.aux, "aux", 2, "[M, N]")).ok()) return s;
    if (t.aux->shape[0] != M || t.aux->shape[1] != N)
      return fail("aux must have shape [" + std::to_string(M) + ", " + std::to_string(N) + "], got " +
                  shape_str(*t.aux));
    if ((N > 1 && t.aux->strides[1] != 1) || (M > 1 && t.aux->strides[0] != N))
      return fail("aux must be contiguous, got strides " + strides_str(*t.aux));
  }
  if (t.a_sum != nullptr && (act != GemmActivation::kNone || t.bias != nullptr))
    return fail("a_sum (the bias gradient of a weight-gradient GEMM) goes without bias and activation");
  p->bias = t.bias != nullptr ? t.bias->data : nullptr;
  p->out = out.data;
  p->ldo = ldo;
  p->aux = t.aux != nullptr ? t.aux->data : nullptr;
  p->a_sum = t.a_sum != nullptr ? t.a_sum->data : nullptr;
  p->M = M, p->N = N, p->K = K;
  *dtype = a.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
