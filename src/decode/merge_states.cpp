// merge_attention_states (decode.h): the argument checks and the public entry; the launcher is
// merge_states.cu, the float64 reference merge_states_reference.cpp. Every message names the entry and
// the argument, and says what was expected.
#include "decode/merge_states.h"

#include <cstdint>
#include <string>
#include <utility>

#include "common/device.h"
#include "common/validate_util.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::non_overlapping;
using validate_util::ranges_overlap;
using validate_util::shape_str;
using validate_util::strides_str;

struct Check {
  const char* name;
  bool cuda;
  const TensorView* ref;  // o_a: the device every tensor shares

  Status fail(const std::string& m) const { return Status::Invalid(std::string(name) + ": " + m); }

  // Present, of rank `ndim`, non-negative sizes and strides, on o_a's device (a CUDA one when cuda).
  Status basic(const TensorView* x, const char* arg, int ndim, const char* form) const {
    if (x == nullptr) return fail(std::string(arg) + " must not be null");
    const std::string r = validate_util::rank_error(*x, arg, ndim, form);
    if (!r.empty()) return fail(r);
    for (int d = 0; d < x->ndim; ++d) {
      if (x->shape[d] < 0) return fail(std::string(arg) + " has a negative size " + shape_str(*x));
      if (x->strides[d] < 0) return fail(std::string(arg) + " must not have negative strides, got " + strides_str(*x));
    }
    if (x->numel() > 0 && x->data == nullptr) return fail(std::string(arg) + " has a null data pointer");
    const bool same = x->device.type == ref->device.type &&
                      (ref->device.type != DeviceType::kCUDA || x->device.index == ref->device.index);
    if (!same)
      return fail(std::string(arg) + " must be on o_a's device (" + device_str(ref->device) + "), got " +
                  device_str(x->device));
    if (cuda && x->device.type != DeviceType::kCUDA)
      return fail(std::string(arg) + " must be a CUDA tensor, got " + device_str(x->device));
    return Status::Ok();
  }

  // An [N, H, D] output / input: the last dimension contiguous (16-byte row accesses).
  Status rows(const TensorView* x, const char* arg) const {
    Status s = basic(x, arg, 3, "[N, H, D]");
    if (!s.ok()) return s;
    if (x->numel() > 0 && x->shape[2] > 1 && x->strides[2] != 1)
      return fail(std::string(arg) + " must be contiguous in its last dimension (stride 1), got strides " +
                  strides_str(*x));
    return Status::Ok();
  }

  // float32 [N, H] (the CPU reference also takes float64), any strides.
  Status lse(const TensorView* x, const char* arg, const TensorView& o) const {
    Status s = basic(x, arg, 2, "[N, H]");
    if (!s.ok()) return s;
    if (x->shape[0] != o.shape[0] || x->shape[1] != o.shape[1])
      return fail(std::string(arg) + " must have shape [" + std::to_string(o.shape[0]) + ", " +
                  std::to_string(o.shape[1]) + "] (o_a's rows and heads), got " + shape_str(*x));
    if (!(x->dtype == DType::kFloat32 || (!cuda && x->dtype == DType::kFloat64)))
      return fail(std::string(arg) + " must be float32" + (cuda ? "" : " (or float64 on CPU)") + ", got " +
                  dtype_name(x->dtype));
    return Status::Ok();
  }
};

}  // namespace

Status validate_merge_states(const char* name, bool cuda, const MergeStatesTensors& t, MergeStatesParams* p,
                             DType* dtype) {
  if (t.o_a == nullptr) return Status::Invalid(std::string(name) + ": o_a must not be null");
  const Check ck{name, cuda, t.o_a};
  Status s = ck.rows(t.o_a, "o_a");
  if (!s.ok()) return s;
  const TensorView& oa = *t.o_a;
  const bool half = oa.dtype == DType::kFloat16 || oa.dtype == DType::kBFloat16;
  if (!(half || oa.dtype == DType::kFloat32 || (!cuda && oa.dtype == DType::kFloat64)))
    return ck.fail(std::string("o_a must be float16, bfloat16 or float32") + (cuda ? "" : " (float64 on CPU)") +
                   ", got " + dtype_name(oa.dtype));
  if (oa.shape[2] > INT32_MAX) return ck.fail("o_a's head dim must fit int32, got " + shape_str(oa));
  if (!(s = ck.rows(t.o_b, "o_b")).ok()) return s;
  const TensorView& ob = *t.o_b;
  if (!validate_util::same_shape(ob, oa))
    return ck.fail("o_b must have o_a's shape " + shape_str(oa) + ", got " + shape_str(ob));
  if (ob.dtype != oa.dtype)
    return ck.fail(std::string("o_b must have o_a's dtype (") + dtype_name(oa.dtype) + "), got " +
                   dtype_name(ob.dtype));

  if (!(s = ck.lse(t.lse_a, "lse_a", oa)).ok()) return s;
  if (!(s = ck.lse(t.lse_b, "lse_b", oa)).ok()) return s;

  if (!(s = ck.rows(t.out, "out")).ok()) return s;
  const TensorView& out = *t.out;
  if (!validate_util::same_shape(out, oa))
    return ck.fail("out must have o_a's shape " + shape_str(oa) + ", got " + shape_str(out));
  if (out.dtype != oa.dtype)
    return ck.fail(std::string("out must have o_a's dtype (") + dtype_name(oa.dtype) + "), got " +
                   dtype_name(out.dtype));
  if (!non_overlapping(out))
    return ck.fail("out has overlapping elements (shape " + shape_str(out) + ", strides " + strides_str(out) +
                   "): outputs would race");
  // In place: each element of out is read (from o_a or o_b) and written by the same thread, so out
  // may be one of the inputs exactly; a partial overlap would read elements already merged.
  auto same_view = [](const TensorView& a, const TensorView& b) {
    if (a.data != b.data) return false;
    for (int d = 0; d < a.ndim; ++d)
      if (a.shape[d] > 1 && a.strides[d] != b.strides[d]) return false;
    return true;
  };
  for (const auto& in : {std::make_pair(&oa, "o_a"), std::make_pair(&ob, "o_b")})
    if (ranges_overlap(out, *in.first) && !same_view(out, *in.first))
      return ck.fail(std::string("out overlaps ") + in.second + " without being " + in.second +
                     " itself (in place needs the same data pointer and strides)");
  for (const auto& in : {std::make_pair(t.lse_a, "lse_a"), std::make_pair(t.lse_b, "lse_b")})
    if (ranges_overlap(out, *in.first)) return ck.fail(std::string("out must not overlap ") + in.second);

  if (t.out_lse != nullptr) {
    if (!(s = ck.lse(t.out_lse, "out_lse", oa)).ok()) return s;
    const TensorView& ol = *t.out_lse;
    if (!non_overlapping(ol))
      return ck.fail("out_lse has overlapping elements (strides " + strides_str(ol) + "): outputs would race");
    // Every thread of a (row, head) reads both lse values; one of them writes out_lse: it must not
    // be an input (other threads of the row may read it later).
    for (const auto& in : {std::make_pair(t.lse_a, "lse_a"), std::make_pair(t.lse_b, "lse_b"),
                           std::make_pair(t.o_a, "o_a"), std::make_pair(t.o_b, "o_b"), std::make_pair(t.out, "out")})
      if (ranges_overlap(ol, *in.first)) return ck.fail(std::string("out_lse must not overlap ") + in.second);
  }

  const TensorView &la = *t.lse_a, &lb = *t.lse_b;
  p->o_a = oa.data;
  p->o_b = ob.data;
  p->out = out.data;
  p->lse_a = la.data;
  p->lse_b = lb.data;
  p->out_lse = t.out_lse != nullptr ? t.out_lse->data : nullptr;
  p->oa_sn = oa.strides[0], p->oa_sh = oa.strides[1];
  p->ob_sn = ob.strides[0], p->ob_sh = ob.strides[1];
  p->out_sn = out.strides[0], p->out_sh = out.strides[1];
  p->la_sn = la.strides[0], p->la_sh = la.strides[1];
  p->lb_sn = lb.strides[0], p->lb_sh = lb.strides[1];
  if (t.out_lse != nullptr) p->lo_sn = t.out_lse->strides[0], p->lo_sh = t.out_lse->strides[1];
  p->rows = oa.shape[0];
  p->heads = oa.shape[1];
  p->head_dim = int32_t(oa.shape[2]);
  *dtype = oa.dtype;
  return Status::Ok();
}

Status merge_attention_states(const MergeStatesTensors& t, cudaStream_t stream) {
  MergeStatesParams p;
  DType dtype = DType::kFloat32;
  Status s = validate_merge_states("merge_attention_states", true, t, &p, &dtype);
  if (!s.ok()) return s;
  const DeviceInfo* dev = nullptr;
  if (!(s = check_device("merge_attention_states", t.o_a->device.index, dtype, &dev)).ok()) return s;
  return launch_merge_states(p, dtype, stream);
}

}  // namespace kernelforge
