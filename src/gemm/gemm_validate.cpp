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
  // Batched calls: out [B, M, N]; a [B, M, K] or [M, K] (shared by every batch), b likewise. The matrix
  // checks below read the last two dimensions; the batch dimension only adds a stride.
  const bool batched = t.out->ndim == 3;
  auto matrix = [&](const TensorView& v, int64_t* bs) {
    TensorView m = v;
    *bs = 0;
    if (v.ndim == 3) {
      m.ndim = 2;
      m.shape[0] = v.shape[1], m.shape[1] = v.shape[2];
      m.strides[0] = v.strides[1], m.strides[1] = v.strides[2];
      *bs = v.shape[0] > 1 ? v.strides[0] : 0;
    }
    return m;
  };
  auto basic = [&](const TensorView& v, const char* arg, int ndim, const char* form) -> Status {
    std::string e = validate_util::rank_error(v, arg, ndim, form);
    for (int d = 0; d < v.ndim && e.empty(); ++d) {
      if (v.shape[d] < 0) e = std::string(arg) + " has a negative size " + shape_str(v);
      if (v.strides[d] < 0) e = std::string(arg) + " must not have negative strides, got " + strides_str(v);
    }
    if (e.empty() && v.numel() > 0 && v.data == nullptr) e = std::string(arg) + " has a null data pointer";
    if (e.empty()) e = validate_util::placement_error(v, arg, *t.a, "a", cuda);
    return e.empty() ? Status::Ok() : fail(e);
  };
  // An operand of a batched call: [B, rows, cols] with out's B, or [rows, cols] shared by every batch.
  auto batched_operand = [&](const TensorView& v, const char* arg, const char* form3, const char* form2) -> Status {
    if (!batched) return basic(v, arg, 2, form2);
    if (v.ndim == 2) return basic(v, arg, 2, form2);
    Status st = basic(v, arg, 3, form3);
    if (!st.ok()) return st;
    if (v.shape[0] != t.out->shape[0])
      return fail(std::string(arg) + " must have out's batch size " + std::to_string(t.out->shape[0]) +
                  " (or 2 dimensions, shared by every batch), got shape " + shape_str(v));
    return Status::Ok();
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
  if (t.out->ndim != 2 && t.out->ndim != 3)
    return fail("out must have 2 dimensions [M, N] or 3 [B, M, N], got " + std::to_string(t.out->ndim) +
                " dimensions " + shape_str(*t.out));
  Status s = batched_operand(*t.a, "a", "[B, M, K]", "[M, K]");
  if (!s.ok()) return s;
  const TensorView& a_full = *t.a;
  const bool narrow =
      a_full.dtype == DType::kFloat16 || a_full.dtype == DType::kBFloat16 || a_full.dtype == DType::kFloat32;
  if (!(narrow || (!cuda && a_full.dtype == DType::kFloat64)))
    return fail(std::string("a must be float16, bfloat16 or float32") + (cuda ? "" : " (float64 on CPU)") + ", got " +
                dtype_name(a_full.dtype));
  if (!(s = batched_operand(*t.b, "b", "[B, N, K]", "[N, K]")).ok()) return s;
  if (!(s = basic(*t.out, "out", t.out->ndim, batched ? "[B, M, N]" : "[M, N]")).ok()) return s;
  int64_t a_bs = 0, b_bs = 0, out_bs = 0;
  const TensorView a = matrix(*t.a, &a_bs), b = matrix(*t.b, &b_bs), out = matrix(*t.out, &out_bs);
  const int64_t batch = batched ? t.out->shape[0] : 1;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[0];
  if (b.shape[1] != K)
    return fail("b must have a's K = " + std::to_string(K) + " columns ([N, K]), got shape " + shape_str(*t.b));
  if (out.shape[0] != M || out.shape[1] != N)
    return fail("out must have shape [" + (batched ? std::to_string(batch) + ", " : std::string()) + std::to_string(M) +
                ", " + std::to_string(N) + "], got " + shape_str(*t.out));
  if (N > 1 && out.strides[1] != 1 && M > 0)
    return fail("out must be row-major (stride 1 along N), got strides " + strides_str(*t.out));
  const int64_t ldo = M > 1 ? out.strides[0] : (N > 0 ? N : 1);
  if (M > 1 && N > 0 && ldo < N)
    return fail("out's rows overlap (row stride " + std::to_string(ldo) + " < N = " + std::to_string(N) + ")");
  if (batch > 1 && M > 0 && N > 0 && out_bs < (M - 1) * ldo + N)
    return fail("out's batches overlap (batch stride " + std::to_string(out_bs) + " < " +
                std::to_string((M - 1) * ldo + N) + ")");
  if (!(s = operand(a, "a", t.a_sum != nullptr, &p->a)).ok()) return s;
  if (!(s = operand(b, "b", false, &p->b)).ok()) return s;
  p->a.bs = a_bs, p->b.bs = b_bs;
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
  if (!(s = vector(t.bias, "bias", N, "[N] (shared by every batch)")).ok()) return s;
  if (t.a_sum != nullptr && batched)
    return fail("a_sum (the bias gradient of a weight-gradient GEMM) takes a 2-D call, got a batched out " +
                shape_str(*t.out));
  if (!(s = vector(t.a_sum, "a_sum", M, "[M]")).ok()) return s;
  if (t.aux != nullptr) {
    if (act != GemmActivation::kGeluTanh)
      return fail(std::string("aux (the pre-activation for the backward) goes with activation gelu_tanh, got ") +
                  to_string(act) + " (relu's backward reads out > 0)");
    if (!(s = basic(*t.aux, "aux", t.out->ndim, batched ? "[B, M, N]" : "[M, N]")).ok()) return s;
    int64_t aux_bs = 0;
    const TensorView aux = matrix(*t.aux, &aux_bs);
    if ((batched && t.aux->shape[0] != batch) || aux.shape[0] != M || aux.shape[1] != N)
      return fail("aux must have out's shape " + shape_str(*t.out) + ", got " + shape_str(*t.aux));
    if ((N > 1 && aux.strides[1] != 1) || (M > 1 && aux.strides[0] != N) || (batch > 1 && aux_bs != M * N))
      return fail("aux must be contiguous, got strides " + strides_str(*t.aux));
  }
  if (t.a_sum != nullptr && (act != GemmActivation::kNone || t.bias != nullptr))
    return fail("a_sum (the bias gradient of a weight-gradient GEMM) goes without bias and activation");
  if (t.accumulate && (act != GemmActivation::kNone || t.bias != nullptr || t.aux != nullptr || t.a_sum != nullptr))
    return fail("accumulate (out += a b^T) goes without bias, activation, aux and a_sum");
  p->accumulate = t.accumulate;
  p->out_bs = out_bs;
  p->batch = batch;
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
