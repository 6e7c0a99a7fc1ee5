// Argument checks of the grouped_mm family: the only place that inspects the public TensorViews.
#include <string>

#include "common/validate_util.h"
#include "grouped_mm/grouped_mm_problem.h"

namespace kernelforge {

namespace {

using validate_util::shape_str;
using validate_util::strides_str;

Status bad(const GmmCall& c, const std::string& m) { return Status::Invalid(std::string(c.name) + ": " + m); }

bool negative(const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0 || t.strides[d] < 0) return true;
  return false;
}

// A row-major matrix [R, C] (stride 1 along C unless C <= 1): its row stride (C when R <= 1, so a
// single row never spoils the alignment check), or -1.
int64_t row_major_ld(const TensorView& t, int d_rows, int d_cols) {
  if (t.shape[d_cols] > 1 && t.strides[d_cols] != 1) return -1;
  return t.shape[d_rows] <= 1 ? t.shape[d_cols] : t.strides[d_rows];
}

}  // namespace

Status validate_grouped_mm(const GmmCall& c, GmmParams* p, DType* dtype) {
  const char* an = c.wgrad ? "dy" : "x";
  const char* bn = c.wgrad ? "x" : "w";
  const char* on = c.wgrad ? "dw" : "out";
  if (c.a == nullptr || c.b == nullptr || c.offsets == nullptr || c.out == nullptr)
    return bad(c, std::string(an) + ", " + bn + ", offsets and " + on + " are required");
  const TensorView &a = *c.a, &b = *c.b, &off = *c.offsets, &out = *c.out;

  // ---- dtypes and devices
  const DType dt = a.dtype;
  const bool dt_ok =
      dt == DType::kBFloat16 || dt == DType::kFloat16 || (!c.cuda && (dt == DType::kFloat32 || dt == DType::kFloat64));
  if (!dt_ok)
    return bad(c, std::string(an) + " must be bfloat16 or float16" +
                      (c.cuda ? "" : " (or float32 / float64 on the CPU)") + ", got " + dtype_name(dt));
  if (b.dtype != dt)
    return bad(c, std::string(bn) + " must have " + an + "'s dtype " + dtype_name(dt) + ", got " + dtype_name(b.dtype));
  if (out.dtype != dt)
    return bad(c,
               std::string(on) + " must have " + an + "'s dtype " + dtype_name(dt) + ", got " + dtype_name(out.dtype));
  if (off.dtype != DType::kInt32) return bad(c, std::string("offsets must be int32, got ") + dtype_name(off.dtype));
  const DeviceType want = c.cuda ? DeviceType::kCUDA : DeviceType::kCPU;
  for (const TensorView* t : {&a, &b, &off, &out})
    if (t->device.type != want || (c.cuda && t->device.index != a.device.index))
      return bad(c, std::string("every tensor must be on ") +
                        (c.cuda ? "the same CUDA device (" + validate_util::device_str(a.device) + ")" : "the CPU"));

  // ---- shapes
  if (off.ndim != 1 || off.shape[0] < 1)
    return bad(c, "offsets must have shape [E] with E >= 1 (the groups' row ends), got " + shape_str(off));
  const int64_t groups = off.shape[0];
  if (groups > (int64_t(1) << 20)) return bad(c, "at most 2^20 groups, got " + std::to_string(groups));
  if (groups > 1 && off.strides[0] != 1) return bad(c, "offsets must be contiguous, got stride " + strides_str(off));
  if (a.ndim != 2) return bad(c, std::string(an) + " must have 2 dimensions, got " + shape_str(a));
  const int64_t t = a.shape[0];
  int64_t n, k;
  if (c.wgrad) {
    n = a.shape[1];
    if (b.ndim != 2 || b.shape[0] != t)
      return bad(c, "x must have shape [T, K] with T = " + std::to_string(t) + " (dy's rows), got " + shape_str(b));
    k = b.shape[1];
    if (out.ndim != 3 || out.shape[0] != groups || out.shape[1] != n || out.shape[2] != k)
      return bad(c, "dw must have shape [E, N, K] = [" + std::to_string(groups) + ", " + std::to_string(n) + ", " +
                        std::to_string(k) + "], got " + shape_str(out));
  } else {
    k = a.shape[1];
    if (b.ndim != 3 || b.shape[0] != groups || b.shape[2] != k)
      return bad(c, "w must have shape [E, N, K] with E = " + std::to_string(groups) +
                        " (offsets' length) and K = " + std::to_string(k) + " (x's columns), got " + shape_str(b));
    n = b.shape[1];
    if (out.ndim != 2 || out.shape[0] != t || out.shape[1] != n)
      return bad(c, "out must have shape [T, N] = [" + std::to_string(t) + ", " + std::to_string(n) + "], got " +
                        shape_str(out));
  }
  const int64_t kMaxDim = (int64_t(1) << 31) - 1;
  if (t > kMaxDim || n > kMaxDim || k > kMaxDim)
    return bad(c, "T, N and K must each be below 2^31 (int32 offsets, int32 tile shapes)");
  for (const TensorView* v : {&a, &b, &off, &out})
    if (negative(*v)) return bad(c, "negative sizes or strides are not supported");

  // ---- layouts
  GmmParams q;
  q.groups = int(groups);
  q.t = t, q.n = n, q.k = k;
  q.a = a.data, q.b = b.data, q.offsets = static_cast<const int*>(off.data), q.out = out.data;
  q.a_ld = row_major_ld(a, 0, 1);
  if (q.a_ld < 0)
    return bad(
        c, std::string(an) + " must be row-major (stride 1 along its last dimension), got strides " + strides_str(a));
  if (c.wgrad) {
    q.op = GroupedMmOp::kWgrad;
    q.b_sn = row_major_ld(b, 0, 1), q.b_sk = 1;
    if (q.b_sn < 0)
      return bad(c, "x must be row-major (stride 1 along its last dimension), got strides " + strides_str(b));
    q.out_ld = row_major_ld(out, 1, 2);
    if (q.out_ld < 0)
      return bad(c, "dw's matrices must be row-major (stride 1 along K), got strides " + strides_str(out));
    q.out_batch = groups == 1 ? 0 : out.strides[0];
  } else {
    if (b.shape[2] <= 1 || b.strides[2] == 1) {
      q.op = GroupedMmOp::kRowsWRow;
      q.b_sk = 1, q.b_sn = b.shape[1] <= 1 ? k : b.strides[1];
    } else if (b.shape[1] <= 1 || b.strides[1] == 1) {
      q.op = GroupedMmOp::kRowsWCol;
      q.b_sn = 1, q.b_sk = b.strides[2];
    } else {
      return bad(c,
                 "w's matrices must have stride 1 along N or along K (w or a transposed view of a [E, K, N] "
                 "tensor), got strides " +
                     strides_str(b));
    }
    q.b_batch = groups == 1 ? 0 : b.strides[0];
    q.out_ld = row_major_ld(out, 0, 1);
    if (q.out_ld < 0) return bad(c, "out must be row-major (stride 1 along N), got strides " + strides_str(out));
  }
  for (const TensorView* v : {&a, &b, &off, &out})
    if (v->numel() > 0 && v->data == nullptr) return bad(c, "a tensor with elements has a null data pointer");
  *p = q;
  *dtype = dt;
  return Status::Ok();
}

GmmProblem make_gmm_problem(const GmmParams& p, DType dtype) {
  GmmProblem r;
  r.op = p.op;
  r.groups = p.groups;
  r.t = p.t, r.n = p.n, r.k = p.k;
  r.elem_bytes = int(dtype_size(dtype));
  auto al16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const int64_t v = 16 / r.elem_bytes;
  const int64_t b_ld = p.op == GroupedMmOp::kRowsWCol ? p.b_sk : p.b_sn;
  r.tma_aligned = r.elem_bytes == 2 && al16(p.a) && al16(p.b) && al16(p.out) && p.n % v == 0 && p.k % v == 0 &&
                  p.a_ld % v == 0 && b_ld % v == 0 && p.b_batch % v == 0 && p.out_ld % v == 0 && p.out_batch % v == 0;
  return r;
}

}  // namespace kernelforge
