// float64 CPU reference of the graph family: the test oracle and the CPU implementation of the
// PyTorch ops. The formulas of include/kernelforge/graph.h in double, every output rounded once; the
// index values the CUDA path cannot check without a host synchronization are checked here.
#include <cmath>
#include <string>
#include <vector>

#include "common/host_convert.h"
#include "graph/graph_problem.h"

namespace kernelforge {
namespace ref {

namespace {

int64_t idx(const void* base, DType t, int64_t i) {
  return t == DType::kInt64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}

// rowptr [n + 1]: starts at 0, never decreases, ends at `total`.
Status check_rowptr(const char* op, const char* name, const void* rp, DType t, int64_t n, int64_t total) {
  if (idx(rp, t, 0) != 0)
    return Status::Invalid(std::string(op) + ": " + name + "[0] must be 0, got " + std::to_string(idx(rp, t, 0)));
  for (int64_t v = 0; v < n; ++v)
    if (idx(rp, t, v + 1) < idx(rp, t, v))
      return Status::Invalid(std::string(op) + ": " + name + " must be non-decreasing, but " + name + "[" +
                             std::to_string(v + 1) + "] = " + std::to_string(idx(rp, t, v + 1)) + " < " + name + "[" +
                             std::to_string(v) + "] = " + std::to_string(idx(rp, t, v)));
  if (idx(rp, t, n) != total)
    return Status::Invalid(std::string(op) + ": " + name + "[-1] must equal the number of positions (" +
                           std::to_string(total) + "), got " + std::to_string(idx(rp, t, n)));
  return Status::Ok();
}

Status check_range(const char* op, const char* name, const void* a, DType t, int64_t n, int64_t limit,
                   const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = idx(a, t, i);
    if (v < 0 || v >= limit)
      return Status::Invalid(std::string(op) + ": " + name + "[" + std::to_string(i) + "] = " + std::to_string(v) +
                             " is out of range [0, " + std::to_string(limit) + ") (" + what + ")");
  }
  return Status::Ok();
}

// The max rule of the kernels: the first maximum wins, NaN propagates.
bool takes_max(double val, double acc, int64_t arg) {
  return arg < 0 || val > acc || (std::isnan(val) && !std::isnan(acc));
}

}  // namespace

Status gather_reduce(const GatherReduceArgs& a) {
  GraphCall c;
  c.op = GraphOp::kGatherReduce;
  c.cuda = false;
  c.name = a.name;
  c.gr = &a;
  GraphParams p;
  DType t = DType::kFloat64, it = DType::kInt64;
  Status s = validate_graph(c, &p, &t, &it);
  if (!s.ok()) return s;
  if (!(s = check_rowptr(a.name, "rowptr", p.rowptr, it, p.nseg, p.nnz)).ok()) return s;
  if (p.col && !(s = check_range(a.name, "col", p.col, it, p.nnz, p.x_rows, "rows of x")).ok()) return s;
  if (p.eid && !(s = check_range(a.name, "eid", p.eid, it, p.nnz, p.nnz, "positions")).ok()) return s;
  if (p.scale_rowptr) {
    for (int64_t r = 0; r <= p.x_rows; ++r)
      if (idx(p.scale_rowptr, it, r) < 0 || (r > 0 && idx(p.scale_rowptr, it, r) < idx(p.scale_rowptr, it, r - 1)))
        return Status::Invalid(std::string(a.name) + ": scale_rowptr must be non-negative and non-decreasing");
  }
  const int64_t F = p.features;
  std::vector<double> acc(size_t(F > 0 ? F : 1));
  std::vector<int64_t> arg(size_t(F > 0 ? F : 1));
  for (int64_t v = 0; v < p.nseg; ++v) {
    const int64_t lo = idx(p.rowptr, it, v), hi = idx(p.rowptr, it, v + 1);
    for (int64_t f = 0; f < F; ++f) acc[f] = 0.0, arg[f] = -1;
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t r = p.col ? idx(p.col, it, k) : k;
      const int64_t e = p.eid ? idx(p.eid, it, k) : k;
      double w = p.weight ? load_as_double(p.weight, t, e) : 1.0;
      if (p.scale_rowptr) w /= double(idx(p.scale_rowptr, it, r + 1) - idx(p.scale_rowptr, it, r));
      for (int64_t f = 0; f < F; ++f) {
        double term = w * load_as_double(p.x, t, r * p.x_stride + f);
        if (p.mask_arg && p.mask_arg[r * F + f] != e) term = 0.0;
        if (a.reduce == GraphReduce::kMax) {
          if (takes_max(term, acc[f], arg[f])) acc[f] = term, arg[f] = e;
        } else {
          acc[f] += term;
        }
      }
    }
    for (int64_t f = 0; f < F; ++f) {
      double o = acc[f];
      if (p.mean && hi > lo) o /= double(hi - lo);
      store_from_double(p.out, t, v * p.out_stride + f, o);
      if (p.argmax) p.argmax[v * F + f] = int32_t(arg[f]);
    }
  }
  return Status::Ok();
}

Status segment_reduce_backward(const char* name, const TensorView& dout, const TensorView& rowptr, GraphReduce reduce,
                               const TensorView* argmax, const TensorView& dx) {
  GraphCall c;
  c.op = GraphOp::kExpand;
  c.cuda = false;
  c.name = name;
  c.dout = &dout;
  c.rowptr = &rowptr;
  c.reduce = reduce;
  c.argmax = argmax;
  c.result = &dx;
  GraphParams p;
  DType t = DType::kFloat64, it = DType::kInt64;
  Status s = validate_graph(c, &p, &t, &it);
  if (!s.ok()) return s;
  if (!(s = check_rowptr(name, "rowptr", p.rowptr, it, p.nseg, p.nnz)).ok()) return s;
  const int64_t F = p.features;
  for (int64_t v = 0; v < p.nseg; ++v) {
    const int64_t lo = idx(p.rowptr, it, v), hi = idx(p.rowptr, it, v + 1);
    for (int64_t k = lo; k < hi; ++k)
      for (int64_t f = 0; f < F; ++f) {
        double g = load_as_double(p.x, t, v * p.x_stride + f);
        if (p.mean) g /= double(hi - lo);
        if (reduce == GraphReduce::kMax && p.mask_arg[v * F + f] != k) g = 0.0;
        store_from_double(p.out, t, k * p.out_stride + f, g);
      }
  }
  return Status::Ok();
}

Status edge_weight_grad(const char* name, const TensorView& dout, const TensorView& x, const TensorView& src,
                        const TensorView& dst, const TensorView& rowptr, GraphReduce reduce, const TensorView* argmax,
                        const TensorView& dw) {
  GraphCall c;
  c.op = GraphOp::kEdgeDot;
  c.cuda = false;
  c.name = name;
  c.dout = &dout;
  c.x = &x;
  c.src = &src;
  c.dst = &dst;
  c.rowptr = &rowptr;
  c.reduce = reduce;
  c.argmax = argmax;
  c.result = &dw;
  GraphParams p;
  DType t = DType::kFloat64, it = DType::kInt64;
  Status s = validate_graph(c, &p, &t, &it);
  if (!s.ok()) return s;
  if (!(s = check_rowptr(name, "rowptr", p.rowptr, it, p.nseg, p.nnz)).ok()) return s;
  if (!(s = check_range(name, "src", p.src, it, p.nnz, p.x_rows, "rows of x")).ok()) return s;
  if (!(s = check_range(name, "dst", p.col, it, p.nnz, p.nseg, "rows of dout")).ok()) return s;
  const int64_t F = p.features;
  for (int64_t e = 0; e < p.nnz; ++e) {
    const int64_t sr = idx(p.src, it, e), d = idx(p.col, it, e);
    double acc = 0.0;
    for (int64_t f = 0; f < F; ++f) {
      if (reduce == GraphReduce::kMax && p.mask_arg[d * F + f] != e) continue;
      acc += load_as_double(p.x, t, sr * p.x_stride + f) * load_as_double(p.g, t, d * p.g_stride + f);
    }
    if (p.mean) acc /= double(idx(p.rowptr, it, d + 1) - idx(p.rowptr, it, d));
    store_from_double(p.out, t, e, acc);
  }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
