// Argument checks for the dropout family: the one place that validates (see dropout_problem.h).
#include <cmath>
#include <string>

#include "common/validate_util.h"
#include "dropout/dropout_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::same_shape;
using validate_util::shape_str;
using validate_util::strides_str;

// Row-major contiguous: every dimension of size > 1 has the stride of the elements inside it.
bool contiguous(const TensorView& t) {
  int64_t expect = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

struct Checker {
  const DropCall& c;
  const TensorView* primary = nullptr;
  const char* pname = "";
  explicit Checker(const DropCall& call) : c(call) {}

  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  Status primary_ok(const TensorView& x, const char* name) const {
    const bool ok = x.dtype == DType::kFloat32 || x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16 ||
                    (!c.cuda && x.dtype == DType::kFloat64);
    if (!ok)
      return fail(std::string(name) + " must be a " + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                  " tensor, got " + dtype_name(x.dtype));
    if (x.ndim < 0 || x.ndim > kMaxDims)
      return fail(std::string(name) + " must have at most " + std::to_string(kMaxDims) + " dimensions, got " +
                  std::to_string(x.ndim));
    for (int d = 0; d < x.ndim; ++d)
      if (x.shape[d] < 0) return fail(std::string(name) + " has a negative size " + shape_str(x));
    if (c.cuda && x.device.type != DeviceType::kCUDA)
      return fail(std::string(name) + " must be a CUDA tensor, got " + device_str(x.device) +
                  " (use kernelforge::ref:: for CPU)");
    if (!c.cuda && x.device.type != DeviceType::kCPU)
      return fail(std::string(name) + " must be a CPU tensor for the reference, got " + device_str(x.device));
    return dense(x, name);
  }

  Status dense(const TensorView& t, const char* name) const {
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    if (t.numel() > 0 && !contiguous(t))
      return fail(std::string(name) + " must be contiguous (shape " + shape_str(t) + ", strides " + strides_str(t) +
                  "); make it contiguous first");
    return Status::Ok();
  }

  // Same shape, dtype and device as the primary tensor, contiguous.
  Status like_primary(const TensorView* t, const char* name) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    const TensorView& p = *primary;
    if (t->dtype != p.dtype)
      return fail(std::string(name) + " must have the same dtype as " + pname + " (" + dtype_name(p.dtype) + "), got " +
                  dtype_name(t->dtype));
    if (t->device.type != p.device.type || (p.device.type == DeviceType::kCUDA && t->device.index != p.device.index))
      return fail(std::string(name) + " must be on the same device as " + pname + " (" + device_str(p.device) +
                  "), got " + device_str(t->device));
    if (!same_shape(*t, p))
      return fail(std::string(name) + " must have the shape of " + pname + " " + shape_str(p) + ", got " +
                  shape_str(*t));
    return dense(*t, name);
  }

  // The 2-element int64 (seed, offset) buffer on the primary tensor's device.
  Status rng_state_ok(const TensorView& t) const {
    if (t.dtype != DType::kInt64)
      return fail(std::string("rng_state must be an int64 tensor, got ") + dtype_name(t.dtype));
    if (t.numel() != 2) return fail("rng_state must hold 2 elements (seed, offset), got shape " + shape_str(t));
    const TensorView& p = *primary;
    if (t.device.type != p.device.type || (p.device.type == DeviceType::kCUDA && t.device.index != p.device.index))
      return fail("rng_state must be on the same device as " + std::string(pname) + " (" + device_str(p.device) +
                  "), got " + device_str(t.device));
    if (t.data == nullptr) return fail("rng_state has a null data pointer");
    if (!contiguous(t)) return fail("rng_state must be contiguous, got strides " + strides_str(t));
    return Status::Ok();
  }
};

}  // namespace

KeepRule keep_rule(double p) {
  KeepRule k;
  k.threshold = uint32_t(std::floor((1.0 - p) * 65536.0 + 0.5));  // (1 - p) 2^16, rounded: 0 .. 65536
  k.scale = p < 1.0 ? float(1.0 / (1.0 - p)) : 0.f;
  return k;
}

Status validate_dropout(const DropCall& c, DropParams* p, DType* dtype) {
  Checker ck(c);
  const bool bwd = c.op == DropOp::kBackward;
  const TensorView* prim = bwd ? c.dy : c.x;
  ck.pname = bwd ? "dy" : "x";
  if (prim == nullptr) return ck.fail(std::string(ck.pname) + " must not be null");
  ck.primary = prim;
  Status s = ck.primary_ok(*prim, ck.pname);
  if (!s.ok()) return s;
  if (!(c.p >= 0.0 && c.p <= 1.0))  // also rejects NaN
    return ck.fail("p must lie in [0, 1], got " + std::to_string(c.p));

  *p = DropParams();
  p->numel = prim->numel();
  p->keep = keep_rule(c.p);
  p->in = prim->data;
  if (!bwd) {
    if (c.op == DropOp::kDropoutAdd) {
      if (!(s = ck.like_primary(c.residual, "residual")).ok()) return s;
      p->add = c.residual->data;
    }
    if (!(s = ck.like_primary(c.y, "y")).ok()) return s;
    p->out = c.y->data;
    p->mask = c.mask;
    if (c.rng_state != nullptr) {
      if (!(s = ck.rng_state_ok(*c.rng_state)).ok()) return s;
      p->rng_out = static_cast<int64_t*>(c.rng_state->data);
    }
    if (c.rng.captured) {
      if (!c.cuda) return ck.fail("a captured PhiloxState (device pointers) cannot drive the CPU reference");
      if (c.rng.seed_ptr == nullptr || c.rng.offset_ptr == nullptr)
        return ck.fail("a captured PhiloxState needs seed_ptr and offset_ptr (device pointers), got a null one");
      if (c.rng.offset_intragraph % 4 != 0)
        return ck.fail("PhiloxState offset_intragraph must be a multiple of 4 (32-bit values, 4 per counter), got " +
                       std::to_string(c.rng.offset_intragraph));
    } else if (c.rng.offset % 4 != 0) {
      return ck.fail("PhiloxState offset must be a multiple of 4 (32-bit values, 4 per counter), got " +
                     std::to_string(c.rng.offset));
    }
    p->rng = c.rng;
  } else {
    if (!(s = ck.like_primary(c.dx, "dx")).ok()) return s;
    p->out = c.dx->data;
    if (c.rng_state == nullptr) return ck.fail("rng_state must not be null");
    if (!(s = ck.rng_state_ok(*c.rng_state)).ok()) return s;
    const int64_t* st = static_cast<const int64_t*>(c.rng_state->data);
    if (c.cuda) {  // read on the device, by the kernel
      p->rng.captured = true;
      p->rng.seed_ptr = st;
      p->rng.offset_ptr = st + 1;
    } else {
      p->rng.seed = uint64_t(st[0]);
      p->rng.offset = uint64_t(st[1]);
    }
  }
  *dtype = prim->dtype;
  return Status::Ok();
}

}  // namespace kernelforge
