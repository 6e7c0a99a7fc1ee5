// Argument checks for the normalization family: the one place that validates (see norm_problem.h).
#include <climits>
#include <string>

#include "common/validate_util.h"
#include "norm/norm_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::same_shape;
using validate_util::shape_str;
using validate_util::strides_str;

struct Checker {
  const NormCall& c;
  std::string prefix;
  explicit Checker(const NormCall& call) : c(call), prefix(std::string(call.name) + ": ") {}

  Status fail(const std::string& m) const { return Status::Invalid(prefix + m); }

  Status dtype_ok(const TensorView& t, const char* name) const {
    bool ok = t.dtype == DType::kFloat32 || t.dtype == DType::kFloat16 || t.dtype == DType::kBFloat16 ||
              (!c.cuda && t.dtype == DType::kFloat64);
    if (!ok)
      return fail(std::string(name) + " must be a " + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                  " tensor, got " + dtype_name(t.dtype));
    return Status::Ok();
  }

  // Same dtype and device as x, non-null data when non-empty.
  Status like_x(const TensorView& t, const char* name) const {
    const TensorView& x = *c.x;
    if (t.dtype != x.dtype)
      return fail(std::string(name) + " must have the same dtype as x (" + dtype_name(x.dtype) + "), got " +
                  dtype_name(t.dtype));
    if (t.device.type != x.device.type || (x.device.type == DeviceType::kCUDA && t.device.index != x.device.index))
      return fail(std::string(name) + " must be on the same device as x (" + device_str(x.device) + "), got " +
                  device_str(t.device));
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    if (t.ndim < 0 || t.ndim > kMaxDims) return fail(std::string(name) + " has an invalid number of dimensions");
    return Status::Ok();
  }

  // A [..., N] tensor with the shape of x whose leading dims collapse into one row stride. Outputs
  // must not overlap themselves (rows at least N elements apart), or rows would race.
  Status rows_view(const TensorView& t, const char* name, int64_t* row_stride, bool output = false) const {
    Status s = like_x(t, name);
    if (!s.ok()) return s;
    if (!same_shape(t, *c.x))
      return fail(std::string(name) + " must have the same shape as x " + shape_str(*c.x) + ", got " + shape_str(t));
    if (!(s = row_stride_of(t, name, row_stride)).ok()) return s;
    const int64_t n = t.shape[t.ndim - 1];
    if (output && t.numel() > n && *row_stride < n)
      return fail(std::string(name) + " rows overlap: row stride " + std::to_string(*row_stride) +
                  " is smaller than the row length " + std::to_string(n));
    return Status::Ok();
  }

  Status row_stride_of(const TensorView& t, const char* name, int64_t* row_stride) const {
    const std::string why = validate_util::collapse_rows(t, row_stride);
    return why.empty() ? Status::Ok() : fail(std::string(name) + why);
  }

  Status vector_param(const TensorView& t, const char* name, int64_t n) const {
    Status s = like_x(t, name);
    if (!s.ok()) return s;
    if (t.ndim != 1 || t.shape[0] != n)
      return fail(std::string(name) + " must have shape [" + std::to_string(n) +
                  "] to match the last dimension of x, got " + shape_str(t));
    if (n > 1 && t.strides[0] != 1)
      return fail(std::string(name) + " must be contiguous (stride 1), got stride " + std::to_string(t.strides[0]));
    return Status::Ok();
  }

  // scale/shift: [N], or up to x.ndim dims that broadcast against x as prefix-equal-then-ones, e.g.
  // [B, 1, N] or [B, S, N] for x [B, S, N]. Returns rows per group and the stride between groups.
  Status modulation(const TensorView& t, const char* name, int64_t* rpg, int64_t* groups, int64_t* gstride) const {
    Status s = like_x(t, name);
    if (!s.ok()) return s;
    const TensorView& x = *c.x;
    const int nd = x.ndim;
    const int64_t n = x.shape[nd - 1];
    std::string expect = " must broadcast against x " + shape_str(x) +
                         " as [N], [B, 1, N] or [B, S, N] (leading sizes equal to x's, then ones), got " + shape_str(t);
    if (t.ndim < 1 || t.ndim > nd || t.shape[t.ndim - 1] != n) return fail(std::string(name) + expect);
    if (n > 1 && t.strides[t.ndim - 1] != 1)
      return fail(std::string(name) + " must be contiguous in its last dimension (stride 1), got stride " +
                  std::to_string(t.strides[t.ndim - 1]));
    // Align t's dims to x's trailing dims (PyTorch broadcasting); missing leading dims are ones.
    const int off = nd - t.ndim;
    auto tsize = [&](int d) { return d < off ? int64_t(1) : t.shape[d - off]; };
    auto tstride = [&](int d) { return d < off ? int64_t(0) : t.strides[d - off]; };
    int p = nd - 1;  // dims [p, nd-1) are ones in t
    while (p > 0 && tsize(p - 1) == 1) --p;
    for (int d = 0; d < p; ++d)
      if (tsize(d) != x.shape[d]) return fail(std::string(name) + expect);
    int64_t g = 1, r = 1;
    for (int d = 0; d < p; ++d) g *= x.shape[d];
    for (int d = p; d < nd - 1; ++d) r *= x.shape[d];
    // Dims [0, p) of t must collapse into one stride (irrelevant when nothing is read).
    int64_t stride = n, want = -1;
    for (int d = p - 1; d >= 0 && x.numel() > 0; --d) {
      if (tsize(d) == 1) continue;
      if (want < 0)
        stride = tstride(d);
      else if (tstride(d) != want)
        return fail(std::string(name) + " must have leading dimensions that collapse into one stride (shape " +
                    shape_str(t) + ", strides " + strides_str(t) + ")");
      want = tstride(d) * tsize(d);
    }
    *rpg = r;
    *groups = g;
    *gstride = stride;
    return Status::Ok();
  }

  Status contiguous_like(const TensorView& out, const TensorView& like, const char* name) const {
    Status s = like_x(out, name);
    if (!s.ok()) return s;
    if (!same_shape(out, like))
      return fail(std::string(name) + " must have shape " + shape_str(like) + ", got " + shape_str(out));
    int64_t expect = 1;
    for (int d = out.ndim - 1; d >= 0 && out.numel() > 0; --d) {
      if (out.shape[d] != 1 && out.strides[d] != expect)
        return fail(std::string(name) + " must be contiguous, got strides " + strides_str(out));
      expect *= out.shape[d];
    }
    return Status::Ok();
  }
};

}  // namespace

Status validate_norm(const NormCall& c, NormParams* p, DType* dtype) {
  Checker ck(c);
  if (c.x == nullptr) return ck.fail("x must not be null");
  const TensorView& x = *c.x;
  Status s = ck.dtype_ok(x, "x");
  if (!s.ok()) return s;
  if (x.ndim < 1 || x.ndim > kMaxDims)
    return ck.fail("x must have between 1 and " + std::to_string(kMaxDims) + " dimensions, got " +
                   std::to_string(x.ndim));
  for (int d = 0; d < x.ndim; ++d)
    if (x.shape[d] < 0) return ck.fail("x has a negative size " + shape_str(x));
  if (c.cuda && x.device.type != DeviceType::kCUDA)
    return ck.fail("x must be a CUDA tensor, got " + device_str(x.device) + " (use kernelforge::ref:: for CPU)");
  if (!c.cuda && x.device.type != DeviceType::kCPU)
    return ck.fail("x must be a CPU tensor for the reference, got " + device_str(x.device));
  if (x.numel() > 0 && x.data == nullptr) return ck.fail("x has a null data pointer");
  if (!(c.eps >= 0.f)) return ck.fail("eps must be a non-negative number, got " + std::to_string(c.eps));

  const int64_t n = x.shape[x.ndim - 1];
  if (n > INT_MAX) return ck.fail("the last dimension of x must be at most 2^31 - 1, got " + std::to_string(n));
  p->n = n;
  p->inv_n = n > 0 ? float(1.0 / double(n)) : 0.f;
  p->rows = n == 0 ? 0 : x.numel() / n;
  p->eps = c.eps;
  if (x.numel() == 0) p->rows = 0;

  int64_t stride = 0;
  s = ck.row_stride_of(x, "x", &stride);
  if (!s.ok()) return s;
  p->x = x.data;
  p->x_stride = stride;

  const bool need_w = c.weight != nullptr, need_b = c.bias != nullptr;
  if (need_w) {
    if (!(s = ck.vector_param(*c.weight, "weight", n)).ok()) return s;
    p->weight = c.weight->data;
  }
  if (need_b) {
    if (!(s = ck.vector_param(*c.bias, "bias", n)).ok()) return s;
    p->bias = c.bias->data;
  }
  if (c.op == NormOp::kAddRms && !c.backward) {
    if (c.residual == nullptr) return ck.fail("residual must not be null");
    if (!(s = ck.rows_view(*c.residual, "residual", &p->res_stride)).ok()) return s;
    p->residual = c.residual->data;
  }
  if (norm_is_ada(c.op)) {
    if (c.kind != NormKind::kRms && c.kind != NormKind::kLayer)
      return ck.fail("kind must be NormKind::kRms or NormKind::kLayer, got " + std::to_string(int(c.kind)));
    if (c.scale == nullptr || c.shift == nullptr) return ck.fail("scale and shift must not be null");
    int64_t rpg1 = 0, g1 = 0, rpg2 = 0, g2 = 0;
    if (!(s = ck.modulation(*c.scale, "scale", &rpg1, &g1, &p->scale_stride)).ok()) return s;
    if (!(s = ck.modulation(*c.shift, "shift", &rpg2, &g2, &p->shift_stride)).ok()) return s;
    if (rpg1 != rpg2 || !same_shape(*c.scale, *c.shift))
      return ck.fail("scale and shift must have the same shape, got " + shape_str(*c.scale) + " and " +
                     shape_str(*c.shift));
    p->scale = c.scale->data;
    p->shift = c.shift->data;
    p->ada_rpg = rpg1 > 0 ? rpg1 : 1;
    p->ada_groups = g1;
    if (p->ada_rpg < (int64_t(1) << 31)) {
      const FastDiv f = make_fast_div(p->ada_rpg);
      p->ada_mul = f.mul;
      p->ada_shr = f.shr;
    }
  }

  if (!c.backward) {
    if (c.y == nullptr) return ck.fail("y must not be null");
    if (!(s = ck.rows_view(*c.y, "y", &p->y_stride, true)).ok()) return s;
    p->y = c.y->data;
    if (c.op == NormOp::kAddRms) {
      if (c.sum == nullptr) return ck.fail("sum must not be null");
      if (!(s = ck.rows_view(*c.sum, "sum", &p->sum_stride, true)).ok()) return s;
      p->sum = c.sum->data;
    }
  } else {
    if (c.dy == nullptr || c.dx == nullptr) return ck.fail("dy and dx must not be null");
    if (!(s = ck.rows_view(*c.dy, "dy", &p->dy_stride)).ok()) return s;
    if (!(s = ck.rows_view(*c.dx, "dx", &p->dx_stride, true)).ok()) return s;
    p->dy = c.dy->data;
    p->dx = c.dx->data;
    if (c.dsum != nullptr) {
      if (!(s = ck.rows_view(*c.dsum, "dsum", &p->dsum_stride)).ok()) return s;
      p->dsum = c.dsum->data;
    }
    if (c.dweight != nullptr) {
      if (!need_w) return ck.fail("dweight was requested but weight is null");
      if (!(s = ck.contiguous_like(*c.dweight, *c.weight, "dweight")).ok()) return s;
      p->dweight = c.dweight->data;
    }
    if (c.dbias != nullptr) {
      if (!need_b) return ck.fail("dbias was requested but bias is null");
      if (!(s = ck.contiguous_like(*c.dbias, *c.bias, "dbias")).ok()) return s;
      p->dbias = c.dbias->data;
    }
    if (c.dscale != nullptr) {
      if (!(s = ck.contiguous_like(*c.dscale, *c.scale, "dscale")).ok()) return s;
      p->dscale = c.dscale->data;
    }
    if (c.dshift != nullptr) {
      if (!(s = ck.contiguous_like(*c.dshift, *c.shift, "dshift")).ok()) return s;
      p->dshift = c.dshift->data;
    }
  }
  *dtype = x.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
