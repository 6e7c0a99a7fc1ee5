// Argument checks for the graph family: the one place that validates (see graph_problem.h).
#include <climits>
#include <string>

#include "common/validate_util.h"
#include "graph/graph_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::shape_str;

struct Checker {
  const GraphCall& c;
  const TensorView* primary = nullptr;  // the first value tensor: dtype and device of the call
  const char* pname = "";
  DType idx_dtype = DType::kOther;  // the index dtype, set by the first index tensor
  const char* iname = "";
  explicit Checker(const GraphCall& call) : c(call) {}

  // The message is only built on failure: a valid call allocates nothing here.
  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  Status common(const TensorView& t, const char* name) const {
    if (t.ndim < 0 || t.ndim > kMaxDims) return fail(std::string(name) + " has an invalid number of dimensions");
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] < 0) return fail(std::string(name) + " has a negative size " + shape_str(t));
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    if (primary == nullptr) {
      if (c.cuda && t.device.type != DeviceType::kCUDA)
        return fail(std::string(name) + " must be a CUDA tensor, got " + device_str(t.device) +
                    " (use kernelforge::ref:: for CPU)");
      if (!c.cuda && t.device.type != DeviceType::kCPU)
        return fail(std::string(name) + " must be a CPU tensor for the reference, got " + device_str(t.device));
      return Status::Ok();
    }
    const Device& pd = primary->device;
    if (t.device.type != pd.type || (pd.type == DeviceType::kCUDA && t.device.index != pd.index))
      return fail(std::string(name) + " must be on the same device as " + pname + " (" + device_str(pd) + "), got " +
                  device_str(t.device));
    return Status::Ok();
  }

  // A [rows, F] value tensor: x's dtype (the first one sets it), a contiguous last dimension and one
  // row stride; outputs must not overlap themselves.
  Status rows(const TensorView* t, const char* name, int64_t want_rows, int64_t want_f, int64_t* stride, bool output) {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = common(*t, name);
    if (!s.ok()) return s;
    if (primary == nullptr) {
      const bool ok = t->dtype == DType::kFloat32 || t->dtype == DType::kFloat16 || t->dtype == DType::kBFloat16 ||
                      (!c.cuda && t->dtype == DType::kFloat64);
      if (!ok)
        return fail(std::string(name) + " must be a " + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                    " tensor, got " + dtype_name(t->dtype));
      primary = t;
      pname = name;
    } else if (t->dtype != primary->dtype) {
      return fail(std::string(name) + " must have the same dtype as " + pname + " (" + dtype_name(primary->dtype) +
                  "), got " + dtype_name(t->dtype));
    }
    if (t->ndim != 2) return fail(std::string(name) + " must have 2 dimensions [rows, features], got " + shape_str(*t));
    if ((want_rows >= 0 && t->shape[0] != want_rows) || (want_f >= 0 && t->shape[1] != want_f))
      return fail(std::string(name) + " must have shape [" + (want_rows >= 0 ? std::to_string(want_rows) : "*") + ", " +
                  std::to_string(want_f >= 0 ? want_f : t->shape[1]) + "], got " + shape_str(*t));
    const std::string why = validate_util::collapse_rows(*t, stride);
    if (!why.empty()) return fail(std::string(name) + why);
    if (output && t->shape[0] > 1 && t->shape[1] > 0 && *stride < t->shape[1])
      return fail(std::string(name) + " rows overlap: row stride " + std::to_string(*stride) +
                  " is smaller than the row length " + std::to_string(t->shape[1]));
    return Status::Ok();
  }

  // A contiguous 1-D index tensor (int32 or int64, one dtype per call) of `want` elements (-1: any).
  Status index(const TensorView* t, const char* name, int64_t want, const char* what) {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = common(*t, name);
    if (!s.ok()) return s;
    if (t->dtype != DType::kInt32 && t->dtype != DType::kInt64)
      return fail(std::string(name) + " must be an int32 or int64 tensor, got " + dtype_name(t->dtype));
    if (idx_dtype == DType::kOther) {
      idx_dtype = t->dtype;
      iname = name;
    } else if (t->dtype != idx_dtype) {
      return fail(std::string(name) + " must have the same dtype as " + iname + " (" + dtype_name(idx_dtype) +
                  "), got " + dtype_name(t->dtype));
    }
    if (t->ndim != 1) return fail(std::string(name) + " must have 1 dimension, got " + shape_str(*t));
    if (want >= 0 && t->shape[0] != want)
      return fail(std::string(name) + " must have " + std::to_string(want) + " elements (" + what + "), got " +
                  shape_str(*t));
    if (t->shape[0] > 1 && t->strides[0] != 1)
      return fail(std::string(name) + " must be contiguous, got stride " + std::to_string(t->strides[0]));
    return Status::Ok();
  }

  // A contiguous 1-D value tensor (x's dtype) of `want` elements.
  Status vector(const TensorView* t, const char* name, int64_t want, const char* what) {
    Status s = common(*t, name);
    if (!s.ok()) return s;
    if (t->dtype != primary->dtype)
      return fail(std::string(name) + " must have the same dtype as " + pname + " (" + dtype_name(primary->dtype) +
                  "), got " + dtype_name(t->dtype));
    if (t->ndim != 1 || t->shape[0] != want)
      return fail(std::string(name) + " must have shape [" + std::to_string(want) + "] (" + what + "), got " +
                  shape_str(*t));
    if (t->shape[0] > 1 && t->strides[0] != 1)
      return fail(std::string(name) + " must be contiguous, got stride " + std::to_string(t->strides[0]));
    return Status::Ok();
  }

  // A contiguous int32 [rows, F] tensor (argmax).
  Status arg(const TensorView* t, const char* name, int64_t want_rows, int64_t f) {
    Status s = common(*t, name);
    if (!s.ok()) return s;
    if (t->dtype != DType::kInt32)
      return fail(std::string(name) + " must be an int32 tensor, got " + dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != want_rows || t->shape[1] != f)
      return fail(std::string(name) + " must have shape [" + std::to_string(want_rows) + ", " + std::to_string(f) +
                  "], got " + shape_str(*t));
    if (t->numel() > 0 && ((f > 1 && t->strides[1] != 1) || (want_rows > 1 && t->strides[0] != f)))
      return fail(std::string(name) + " must be contiguous");
    return Status::Ok();
  }

  Status reduce_ok(GraphReduce r) const {
    if (r != GraphReduce::kSum && r != GraphReduce::kMean && r != GraphReduce::kMax)
      return fail("reduce must be GraphReduce::kSum, kMean or kMax, got " + std::to_string(int(r)));
    return Status::Ok();
  }

  Status argmax_for(GraphReduce r, const TensorView* argmax, int64_t n, int64_t f, int64_t positions) {
    if (r != GraphReduce::kMax) {
      if (argmax != nullptr) return fail("argmax is only taken with reduce max");
      return Status::Ok();
    }
    if (argmax == nullptr)
      return fail("argmax must be given with reduce max (int32 [" + std::to_string(n) + ", " + std::to_string(f) +
                  "])");
    if (positions > INT_MAX)
      return fail("reduce max stores int32 positions: at most 2^31 - 1 positions, got " + std::to_string(positions));
    return arg(argmax, "argmax", n, f);
  }
};

Status validate_gather_reduce(Checker& ck, const GatherReduceArgs& a, GraphParams* p) {
  Status s = ck.reduce_ok(a.reduce);
  if (!s.ok()) return s;
  if (!(s = ck.rows(a.x, "x", -1, -1, &p->x_stride, false)).ok()) return s;
  const int64_t X = a.x->shape[0], F = a.x->shape[1];
  if (!(s = ck.index(a.rowptr, "rowptr", -1, "")).ok()) return s;
  if (a.rowptr->shape[0] < 1) return ck.fail("rowptr must have N + 1 >= 1 elements, got " + shape_str(*a.rowptr));
  const int64_t N = a.rowptr->shape[0] - 1;
  int64_t nnz = X;
  if (a.col != nullptr) {
    if (!(s = ck.index(a.col, "col", -1, "")).ok()) return s;
    nnz = a.col->shape[0];
  }
  if (a.eid != nullptr && !(s = ck.index(a.eid, "eid", nnz, "one per position")).ok()) return s;
  if (a.weight != nullptr && !(s = ck.vector(a.weight, "edge_weight", nnz, "one per edge")).ok()) return s;
  if (a.scale_rowptr != nullptr && !(s = ck.index(a.scale_rowptr, "scale_rowptr", X + 1, "rows of x + 1")).ok())
    return s;
  if (a.mask_arg != nullptr && !(s = ck.arg(a.mask_arg, "mask_arg", X, F)).ok()) return s;
  if (a.mask_arg != nullptr && nnz > INT_MAX)
    return ck.fail("mask_arg compares int32 positions: at most 2^31 - 1 positions, got " + std::to_string(nnz));
  if (N == 0 && nnz > 0)
    return ck.fail("rowptr has no segments (N = 0) but there are " + std::to_string(nnz) + " positions");
  if (!(s = ck.rows(a.out, "out", N, F, &p->out_stride, true)).ok()) return s;
  if (!(s = ck.argmax_for(a.reduce, a.argmax, N, F, nnz)).ok()) return s;
  p->x = a.x->data;
  p->x_rows = X;
  p->rowptr = a.rowptr->data;
  p->col = a.col ? a.col->data : nullptr;
  p->eid = a.eid ? a.eid->data : nullptr;
  p->weight = a.weight ? a.weight->data : nullptr;
  p->scale_rowptr = a.scale_rowptr ? a.scale_rowptr->data : nullptr;
  p->mask_arg = a.mask_arg ? static_cast<const int32_t*>(a.mask_arg->data) : nullptr;
  p->out = a.out->data;
  p->argmax = a.argmax ? static_cast<int32_t*>(a.argmax->data) : nullptr;
  p->nseg = N;
  p->nnz = nnz;
  p->features = F;
  p->mean = a.reduce == GraphReduce::kMean;
  return Status::Ok();
}

}  // namespace

Status validate_graph(const GraphCall& c, GraphParams* p, DType* dtype, DType* index_dtype) {
  Checker ck(c);
  Status s;
  if (c.op == GraphOp::kGatherReduce) {
    if (c.gr == nullptr) return ck.fail("the arguments must not be null");
    if (!(s = validate_gather_reduce(ck, *c.gr, p)).ok()) return s;
  } else if (c.op == GraphOp::kExpand) {
    // dout [N, F], rowptr [N + 1], dx [nnz, F]
    if (!(s = ck.reduce_ok(c.reduce)).ok()) return s;
    if (!(s = ck.rows(c.dout, "dout", -1, -1, &p->x_stride, false)).ok()) return s;
    const int64_t N = c.dout->shape[0], F = c.dout->shape[1];
    if (!(s = ck.index(c.rowptr, "rowptr", N + 1, "rows of dout + 1")).ok()) return s;
    if (!(s = ck.rows(c.result, "dx", -1, F, &p->out_stride, true)).ok()) return s;
    if (N == 0 && c.result->shape[0] > 0)
      return ck.fail("rowptr has no segments (N = 0) but dx has " + std::to_string(c.result->shape[0]) + " rows");
    if (!(s = ck.argmax_for(c.reduce, c.argmax, N, F, c.result->shape[0])).ok()) return s;
    p->x = c.dout->data;
    p->x_rows = N;
    p->rowptr = c.rowptr->data;
    p->out = c.result->data;
    p->mask_arg = c.argmax ? static_cast<const int32_t*>(c.argmax->data) : nullptr;
    p->nseg = N;
    p->nnz = c.result->shape[0];
    p->features = F;
    p->mean = c.reduce == GraphReduce::kMean;
  } else {
    // dout [N, F], x [X, F], src / dst [E], rowptr [N + 1], dw [E]
    if (!(s = ck.reduce_ok(c.reduce)).ok()) return s;
    if (!(s = ck.rows(c.dout, "dout", -1, -1, &p->g_stride, false)).ok()) return s;
    const int64_t N = c.dout->shape[0], F = c.dout->shape[1];
    if (!(s = ck.rows(c.x, "x", -1, F, &p->x_stride, false)).ok()) return s;
    if (!(s = ck.index(c.src, "src", -1, "")).ok()) return s;
    const int64_t E = c.src->shape[0];
    if (!(s = ck.index(c.dst, "dst", E, "one per edge, as src")).ok()) return s;
    if (!(s = ck.index(c.rowptr, "rowptr", N + 1, "rows of dout + 1")).ok()) return s;
    if (c.result == nullptr) return ck.fail("dw must not be null");
    if (!(s = ck.vector(c.result, "dw", E, "one per edge")).ok()) return s;
    if (!(s = ck.argmax_for(c.reduce, c.argmax, N, F, E)).ok()) return s;
    p->g = c.dout->data;
    p->x = c.x->data;
    p->x_rows = c.x->shape[0];
    p->src = c.src->data;
    p->col = c.dst->data;
    p->rowptr = c.rowptr->data;
    p->mask_arg = c.argmax ? static_cast<const int32_t*>(c.argmax->data) : nullptr;
    p->out = c.result->data;
    p->nseg = N;
    p->nnz = E;
    p->features = F;
    p->mean = c.reduce == GraphReduce::kMean;
  }
  *dtype = ck.primary->dtype;
  *index_dtype = ck.idx_dtype;
  return Status::Ok();
}

}  // namespace kernelforge
