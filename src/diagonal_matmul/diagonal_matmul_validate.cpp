// Argument checks for the diagonal_matmul family: the one place that validates (see
// diagonal_matmul_problem.h).
#include <climits>
#include <string>

#include "common/validate_util.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::same_shape;
using validate_util::shape_str;
using validate_util::strides_str;

struct Checker {
  const DmCall& c;
  explicit Checker(const DmCall& call) : c(call) {}

  // The message is only built on failure: a valid call allocates nothing here.
  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  // dtype, device, rank and data pointer of every tensor, against b (the first row tensor).
  Status like_b(const TensorView& t, const char* name) const {
    const TensorView& b = *c.b;
    if (t.dtype != b.dtype)
      return fail(std::string(name) + " must have the same dtype as b (" + dtype_name(b.dtype) + "), got " +
                  dtype_name(t.dtype));
    if (t.device.type != b.device.type || (b.device.type == DeviceType::kCUDA && t.device.index != b.device.index))
      return fail(std::string(name) + " must be on the same device as b (" + device_str(b.device) + "), got " +
                  device_str(t.device));
    if (t.ndim < 0 || t.ndim > kMaxDims) return fail(std::string(name) + " has an invalid number of dimensions");
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] < 0) return fail(std::string(name) + " has a negative size " + shape_str(t));
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    return Status::Ok();
  }

  // A row tensor of b's shape: leading dims collapse into one row stride, the last dim is contiguous.
  // Outputs must not overlap themselves (rows at least a row length apart), or rows would race.
  Status rows_view(const TensorView* t, const char* name, int64_t* row_stride, bool output) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = like_b(*t, name);
    if (!s.ok()) return s;
    if (!same_shape(*t, *c.b))
      return fail(std::string(name) + " must have shape " + shape_str(*c.b) + " (the shape of b), got " +
                  shape_str(*t));
    const std::string why = validate_util::collapse_rows(*t, row_stride);
    if (!why.empty()) return fail(std::string(name) + why);
    const int64_t n = t->shape[t->ndim - 1];
    if (output && t->numel() > n && *row_stride < n)
      return fail(std::string(name) + " rows overlap: row stride " + std::to_string(*row_stride) +
                  " is smaller than the row length " + std::to_string(n));
    return Status::Ok();
  }

  // A tensor of a's shape whose dimensions collapse into one stride (element i of the flattened
  // tensor at i * stride). Outputs must not overlap themselves (stride 0 with more than one element).
  Status scales_view(const TensorView* t, const char* name, const TensorView& want, int64_t* stride,
                     bool output) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = like_b(*t, name);
    if (!s.ok()) return s;
    if (!same_shape(*t, want))
      return fail(std::string(name) + " must have shape " + shape_str(want) + " (the shape of a), got " +
                  shape_str(*t));
    *stride = 1;
    if (t->numel() == 0) return Status::Ok();
    int64_t expect = -1;  // walking outwards: each non-trivial dim's stride = the inner one's stride x size
    for (int d = t->ndim - 1; d >= 0; --d) {
      if (t->shape[d] == 1) continue;
      if (t->strides[d] < 0) return fail(std::string(name) + " must not have negative strides, got " + strides_str(*t));
      if (expect < 0) {
        *stride = t->strides[d];
      } else if (t->strides[d] != expect) {
        return fail(std::string(name) + " must have dimensions that collapse into one stride (shape " + shape_str(*t) +
                    ", strides " + strides_str(*t) + "); make it contiguous first");
      }
      expect = t->strides[d] * t->shape[d];
    }
    if (output && t->numel() > 1 && *stride == 0) return fail(std::string(name) + " elements overlap (stride 0)");
    return Status::Ok();
  }
};

}  // namespace

Status validate_diagonal_matmul(const DmCall& c, DmParams* p, DType* dtype, bool* broadcast) {
  Checker ck(c);
  if (c.b == nullptr) return ck.fail("b must not be null");
  if (c.a == nullptr) return ck.fail("a must not be null");
  const TensorView& b = *c.b;
  const TensorView& a = *c.a;
  const bool dtype_ok = b.dtype == DType::kFloat32 || b.dtype == DType::kFloat16 || b.dtype == DType::kBFloat16 ||
                        (!c.cuda && b.dtype == DType::kFloat64);
  if (!dtype_ok)
    return ck.fail(std::string("b must be a ") + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                   " tensor, got " + dtype_name(b.dtype));
  if (b.ndim < 2 || b.ndim > kMaxDims)
    return ck.fail("b must have between 2 and " + std::to_string(kMaxDims) + " dimensions [..., M, N], got " +
                   std::to_string(b.ndim) + " dimensions " + shape_str(b));
  for (int d = 0; d < b.ndim; ++d)
    if (b.shape[d] < 0) return ck.fail("b has a negative size " + shape_str(b));
  if (c.cuda && b.device.type != DeviceType::kCUDA)
    return ck.fail("b must be a CUDA tensor, got " + device_str(b.device) + " (use kernelforge::ref:: for CPU)");
  if (!c.cuda && b.device.type != DeviceType::kCPU)
    return ck.fail("b must be a CPU tensor for the reference, got " + device_str(b.device));
  if (b.numel() > 0 && b.data == nullptr) return ck.fail("b has a null data pointer");
  const int64_t n = b.shape[b.ndim - 1], m = b.shape[b.ndim - 2];
  if (n > INT_MAX) return ck.fail("the last dimension of b must be at most 2^31 - 1, got " + std::to_string(n));
  int64_t b_stride = 0;
  {
    const std::string why = validate_util::collapse_rows(b, &b_stride);
    if (!why.empty()) return ck.fail("b" + why);
  }

  // a: b.shape[:-1] (one scale per row) or [M] broadcast over the batch dimensions.
  Status s = ck.like_b(a, "a");
  if (!s.ok()) return s;
  TensorView per_row = b;  // b.shape[:-1]
  per_row.ndim = b.ndim - 1;
  TensorView per_m = b;  // [M]
  per_m.ndim = 1;
  per_m.shape[0] = m;
  const bool is_per_row = same_shape(a, per_row);
  const bool is_per_m = !is_per_row && same_shape(a, per_m);
  if (!is_per_row && !is_per_m && b.ndim == 2)
    return ck.fail("a must have shape " + shape_str(per_row) + " (b.shape[:-1]: one scale per row), got " +
                   shape_str(a));
  if (!is_per_row && !is_per_m)
    return ck.fail("a must have shape " + shape_str(per_row) + " (b.shape[:-1]: one scale per row) or " +
                   shape_str(per_m) + " ([M]: one scale per matrix row, broadcast over b's batch dimensions), got " +
                   shape_str(a));
  int64_t a_stride = 0;
  if (!(s = ck.scales_view(&a, "a", a, &a_stride, false)).ok()) return s;

  const int64_t rows = b.numel() == 0 ? 0 : b.numel() / n;
  // rows of b when n == 0 (b.numel() is 0 then, but da still has one element per row)
  int64_t all_rows = 1;
  for (int d = 0; d < b.ndim - 1; ++d) all_rows *= b.shape[d];
  p->n = n;
  p->rows = n == 0 ? all_rows : rows;
  p->a_rows = is_per_m ? m : p->rows;
  p->batches = m == 0 ? 0 : p->rows / m;
  *broadcast = is_per_m && p->batches != 1;
  p->a = a.data;
  p->a_stride = a_stride;
  p->b = b.data;
  p->b_stride = b_stride;

  if (!c.backward) {
    if (!(s = ck.rows_view(c.y, "y", &p->y_stride, true)).ok()) return s;
    p->y = c.y->data;
    if (n == 0) p->rows = 0;  // nothing to write
  } else {
    if (!(s = ck.rows_view(c.dy, "dy", &p->dy_stride, false)).ok()) return s;
    p->dy = c.dy->data;
    if (c.da == nullptr && c.db == nullptr) return ck.fail("at least one of da and db must be given");
    if (c.db != nullptr) {
      if (!(s = ck.rows_view(c.db, "db", &p->db_stride, true)).ok()) return s;
      p->db = c.db->data;
    }
    if (c.da != nullptr) {
      if (!(s = ck.scales_view(c.da, "da", a, &p->da_stride, true)).ok()) return s;
      p->da = c.da->data;
    }
  }
  *dtype = b.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
