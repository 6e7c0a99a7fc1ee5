// The PyTorch binding of the graph family (include/kernelforge/graph.h): segment_reduce (segment_sum /
// segment_mean / segment_max), gather_scatter, scatter_add and their backward ops. CUDA = our kernels,
// CPU = the float64 reference, Autograd = the C++ functions below. Fake impls: python/kernelforge/graph.py.
//
// The CSR the kernels walk is built here with torch ops, on the tensors' device and without a host
// synchronization: a stable argsort of the destination (edge order kept inside a segment) and a
// searchsorted of the node ids 0..N into the sorted destinations (rowptr). Index values are checked
// with torch's asynchronous assert (a device-side assertion on CUDA, an error on CPU), as index_add_
// does.
#include <cstdint>
#include <string>
#include <tuple>

#include "kernelforge/graph.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

constexpr EnumName<kf::GraphReduce> kReduce[] = {
    {"sum", kf::GraphReduce::kSum}, {"mean", kf::GraphReduce::kMean}, {"max", kf::GraphReduce::kMax}};
kf::GraphReduce reduce_of(const char* op, c10::string_view reduce) { return parse_enum(op, "reduce", reduce, kReduce); }

// x [rows, ...] as rows of F = prod(trailing dims) features (1-D x: F = 1).
Tensor as_rows(const char* op, const char* name, const Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": ", name, " must have at least 1 dimension [rows, ...], got a scalar");
  int64_t f = 1;
  for (int64_t d = 1; d < x.dim(); ++d) f *= x.size(d);
  return rows(x.reshape({x.size(0), f}));
}
std::vector<int64_t> out_shape(const Tensor& x, int64_t n) {
  auto s = x.sizes().vec();
  s[0] = n;
  return s;
}

void check_index(const char* op, const char* name, const Tensor& t) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, op, ": ", name,
                    " must be an int32 or int64 tensor, got ", c10::toString(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": ", name, " must have 1 dimension, got ", shape_str(t));
}

// Every value of `index` lies in [0, n): asynchronous on CUDA (no host synchronization).
void assert_range(const char* op, const char* name, const Tensor& index, int64_t n) {
  if (index.numel() == 0) return;
  const std::string msg = std::string(op) + ": " + name + " values must lie in [0, " + std::to_string(n) + ")";
  at::_assert_async(at::logical_and(index.min() >= 0, index.max() < n), msg);
}

// rowptr starts at 0, never decreases and ends at `total`.
void assert_rowptr(const char* op, const Tensor& rowptr, int64_t total) {
  if (rowptr.numel() == 0) return;
  Tensor ok = at::logical_and(rowptr[0] == 0, rowptr[-1] == total);
  if (rowptr.numel() > 1) ok = at::logical_and(ok, (rowptr.diff() >= 0).all());
  const std::string msg = std::string(op) + ": rowptr must start at 0, be non-decreasing and end at the rows of x (" +
                          std::to_string(total) + ")";
  at::_assert_async(ok, msg);
}

// The edge indices the kernels read: int32 (half the index traffic of int64, and a 32-bit radix sort),
// which holds every edge id and node id below 2^31.
Tensor index32(const char* op, const char* name, const Tensor& t, int64_t limit) {
  TORCH_CHECK_VALUE(t.numel() <= INT32_MAX && limit <= INT32_MAX, op, ": at most 2^31 - 1 edges and nodes, got ",
                    std::to_string(t.numel()), " entries of ", name, " over ", std::to_string(limit), " nodes");
  return t.to(at::kInt).contiguous();
}

// CSR of items keyed by `key` (values in [0, n)): rowptr [n + 1] and the items' order (`key`'s dtype).
struct Csr {
  Tensor rowptr, order;
};
Csr csr_by(const Tensor& key, int64_t n) {
  const Tensor perm = at::argsort(key, /*stable=*/true);
  const Tensor sorted = key.index_select(0, perm);
  const Tensor ids = at::arange(n + 1, key.options());
  return {at::searchsorted(sorted, ids, /*out_int32=*/key.scalar_type() == at::kInt), perm.to(key.scalar_type())};
}

Tensor workspace_for(const Tensor& x, int64_t nnz, int64_t f, kf::GraphReduce r) {
  return workspace(x, kf::gather_reduce_workspace_bytes(nnz, f, r));
}

// Runs the gather-reduce (cuda: our kernels, else the reference).
void run_gather(bool cuda, const Tensor& like, const kf::GatherReduceArgs& a) {
  if (cuda) {
    c10::cuda::CUDAGuard guard(like.device());
    const int64_t nnz = a.col ? a.col->shape[0] : a.x->shape[0];
    Tensor ws = workspace_for(like, nnz, a.x->shape[1], a.reduce);
    check(kf::gather_reduce(a, ws.data_ptr(), size_t(ws.numel()), stream_of(like)));
  } else {
    check(kf::ref::gather_reduce(a));
  }
}

// ---- segment_reduce ------------------------------------------------------------------------------
std::tuple<Tensor, Tensor> segment_reduce_impl(bool cuda, const Tensor& x_in, const Tensor& rowptr_in,
                                               c10::string_view reduce) {
  const char* op = "segment_reduce";
  const kf::GraphReduce r = reduce_of(op, reduce);
  if (cuda && needs_fallback(op, x_in)) {
    auto [o, a] = segment_reduce_impl(false, x_in.cpu(), rowptr_in.cpu(), reduce);
    return {o.to(x_in.device()), a.to(x_in.device())};
  }
  check_index(op, "rowptr", rowptr_in);
  TORCH_CHECK_VALUE(rowptr_in.numel() >= 1, op, ": rowptr must have N + 1 >= 1 elements, got ", shape_str(rowptr_in));
  const Tensor x = as_rows(op, "x", x_in), rowptr = rowptr_in.contiguous();
  const int64_t n = rowptr.numel() - 1, f = x.size(1);
  if (cuda) assert_rowptr(op, rowptr, x.size(0));
  Tensor out = at::empty({n, f}, x.options());
  Tensor arg = at::empty({r == kf::GraphReduce::kMax ? n : 0, f}, x.options().dtype(at::kInt));
  const kf::TensorView xv = view(x), rv = view(rowptr), ov = view(out), av = view(arg);
  kf::GatherReduceArgs a;
  a.name = reduce == "sum" ? "segment_sum" : reduce == "mean" ? "segment_mean" : "segment_max";
  a.x = &xv, a.rowptr = &rv, a.out = &ov, a.reduce = r;
  if (r == kf::GraphReduce::kMax) a.argmax = &av;
  run_gather(cuda, x, a);
  return {out.view(out_shape(x_in, n)), arg};
}

Tensor segment_reduce_backward_impl(bool cuda, const Tensor& dout_in, const Tensor& rowptr_in, c10::string_view reduce,
                                    const Tensor& argmax, int64_t rows) {
  const char* op = "segment_reduce_backward";
  const kf::GraphReduce r = reduce_of(op, reduce);
  if (cuda && needs_fallback(op, dout_in))
    return segment_reduce_backward_impl(false, dout_in.cpu(), rowptr_in.cpu(), reduce, argmax.cpu(), rows)
        .to(dout_in.device());
  const Tensor dout = as_rows(op, "dout", dout_in), rowptr = rowptr_in.contiguous();
  Tensor dx = at::empty({rows, dout.size(1)}, dout.options());
  const kf::TensorView dv = view(dout), rv = view(rowptr), av = view(argmax), dxv = view(dx);
  const kf::TensorView* ap = r == kf::GraphReduce::kMax ? &av : nullptr;
  if (cuda) {
    c10::cuda::CUDAGuard guard(dout.device());
    check(kf::segment_reduce_backward(op, dv, rv, r, ap, dxv, stream_of(dout)));
  } else {
    check(kf::ref::segment_reduce_backward(op, dv, rv, r, ap, dxv));
  }
  return dx.view(out_shape(dout_in, rows));
}

// ---- gather_scatter ------------------------------------------------------------------------------
void check_edges(const char* op, const Tensor& src, const Tensor& dst) {
  check_index(op, "edge_src", src);
  check_index(op, "edge_dst", dst);
  TORCH_CHECK_VALUE(src.scalar_type() == dst.scalar_type(), op,
                    ": edge_src and edge_dst must have the same dtype, got ", c10::toString(src.scalar_type()), " and ",
                    c10::toString(dst.scalar_type()));
  TORCH_CHECK_VALUE(src.numel() == dst.numel(), op, ": edge_src and edge_dst must have the same length, got ",
                    std::to_string(src.numel()), " and ", std::to_string(dst.numel()));
}

// out [num_nodes, ...], argmax int32 [num_nodes, F] (max; else [0, F]), rowptr int32 [num_nodes + 1] (saved
// for the backward: the in-degrees of mean, the CSR of the edge-weight gradient).
std::tuple<Tensor, Tensor, Tensor> gather_scatter_impl(bool cuda, const Tensor& x_in, const Tensor& src_in,
                                                       const Tensor& dst_in, int64_t num_nodes, c10::string_view reduce,
                                                       const OptTensor& weight_in) {
  const char* op = "gather_scatter";
  const kf::GraphReduce r = reduce_of(op, reduce);
  if (cuda && needs_fallback(op, x_in)) {
    auto [o, a, rp] =
        gather_scatter_impl(false, x_in.cpu(), src_in.cpu(), dst_in.cpu(), num_nodes, reduce, to_cpu(weight_in));
    return {o.to(x_in.device()), a.to(x_in.device()), rp.to(x_in.device())};
  }
  check_edges(op, src_in, dst_in);
  TORCH_CHECK_VALUE(num_nodes >= 0, op, ": num_nodes must be >= 0, got ", std::to_string(num_nodes));
  const Tensor x = as_rows(op, "x", x_in);
  const int64_t f = x.size(1);
  assert_range(op, "edge_src", src_in, x.size(0));
  assert_range(op, "edge_dst", dst_in, num_nodes);
  const Tensor src = index32(op, "edge_src", src_in, x.size(0)), dst = index32(op, "edge_dst", dst_in, num_nodes);
  const Csr csr = csr_by(dst, num_nodes);
  const Tensor col = src.index_select(0, csr.order);
  Tensor weight;
  if (defined(weight_in)) weight = weight_in->contiguous();
  Tensor out = at::empty({num_nodes, f}, x.options());
  Tensor arg = at::empty({r == kf::GraphReduce::kMax ? num_nodes : 0, f}, x.options().dtype(at::kInt));
  const kf::TensorView xv = view(x), rv = view(csr.rowptr), cv = view(col), ev = view(csr.order), ov = view(out);
  const kf::TensorView av = view(arg);
  kf::TensorView wv;
  if (weight.defined()) wv = view(weight);
  kf::GatherReduceArgs a;
  a.name = op;
  a.x = &xv, a.rowptr = &rv, a.col = &cv, a.eid = &ev, a.out = &ov, a.reduce = r;
  if (weight.defined()) a.weight = &wv;
  if (r == kf::GraphReduce::kMax) a.argmax = &av;
  run_gather(cuda, x, a);
  return {out.view(out_shape(x_in, num_nodes)), arg, csr.rowptr};
}

// dx [X, ...] through the transposed CSR (edges sorted by source), dw [E] per edge; each only when asked.
std::tuple<Tensor, Tensor> gather_scatter_backward_impl(bool cuda, const Tensor& dout_in, const Tensor& x_in,
                                                        const Tensor& src_in, const Tensor& dst_in,
                                                        const Tensor& rowptr, c10::string_view reduce,
                                                        const OptTensor& weight_in, const Tensor& argmax, bool need_x,
                                                        bool need_weight) {
  const char* op = "gather_scatter_backward";
  const kf::GraphReduce r = reduce_of(op, reduce);
  if (cuda && needs_fallback(op, x_in)) {
    auto [dx, dw] =
        gather_scatter_backward_impl(false, dout_in.cpu(), x_in.cpu(), src_in.cpu(), dst_in.cpu(), rowptr.cpu(), reduce,
                                     to_cpu(weight_in), argmax.cpu(), need_x, need_weight);
    return {dx.to(x_in.device()), dw.to(x_in.device())};
  }
  check_edges(op, src_in, dst_in);
  const Tensor dout = as_rows(op, "dout", dout_in), x = as_rows(op, "x", x_in);
  const Tensor src = index32(op, "edge_src", src_in, x.size(0)), dst = index32(op, "edge_dst", dst_in, dout.size(0));
  Tensor weight;
  if (defined(weight_in)) weight = weight_in->contiguous();
  const bool max = r == kf::GraphReduce::kMax;
  const kf::TensorView dv = view(dout), xv = view(x), sv = view(src), tv = view(dst), rv = view(rowptr);
  const kf::TensorView av = view(argmax);
  // a gradient not asked for is an empty [0] tensor (the fake's shape), never an undefined one
  Tensor dx = at::empty({0}, x.options()), dw = at::empty({0}, x.options());
  if (need_x) {
    const Csr t = csr_by(src, x.size(0));
    const Tensor col_t = dst.index_select(0, t.order);
    dx = at::empty({x.size(0), x.size(1)}, x.options());
    const kf::TensorView trv = view(t.rowptr), tcv = view(col_t), tev = view(t.order), dxv = view(dx);
    kf::TensorView wv;
    if (weight.defined()) wv = view(weight);
    kf::GatherReduceArgs a;
    a.name = op;
    a.x = &dv, a.rowptr = &trv, a.col = &tcv, a.eid = &tev, a.out = &dxv, a.reduce = kf::GraphReduce::kSum;
    if (weight.defined()) a.weight = &wv;
    if (r == kf::GraphReduce::kMean) a.scale_rowptr = &rv;
    if (max) a.mask_arg = &av;
    run_gather(cuda, dout, a);
    dx = dx.view(x_in.sizes());
  }
  if (need_weight && weight.defined()) {
    dw = at::empty({src.numel()}, x.options());
    const kf::TensorView dwv = view(dw);
    if (cuda) {
      c10::cuda::CUDAGuard guard(x.device());
      check(kf::edge_weight_grad(op, dv, xv, sv, tv, rv, r, max ? &av : nullptr, dwv, stream_of(x)));
    } else {
      check(kf::ref::edge_weight_grad(op, dv, xv, sv, tv, rv, r, max ? &av : nullptr, dwv));
    }
  }
  return {dx, dw};
}

// ---- scatter_add: out[index[e]] += src[e] along dim 0 ------------------------------------------------
Tensor scatter_add_impl(bool cuda, const Tensor& src_in, const Tensor& index_in, int64_t dim_size) {
  const char* op = "scatter_add";
  if (cuda && needs_fallback(op, src_in))
    return scatter_add_impl(false, src_in.cpu(), index_in.cpu(), dim_size).to(src_in.device());
  check_index(op, "index", index_in);
  TORCH_CHECK_VALUE(dim_size >= 0, op, ": dim_size must be >= 0, got ", std::to_string(dim_size));
  const Tensor src = as_rows(op, "src", src_in);
  TORCH_CHECK_VALUE(index_in.numel() == src.size(0), op, ": index must have one entry per row of src (",
                    std::to_string(src.size(0)), "), got ", std::to_string(index_in.numel()));
  assert_range(op, "index", index_in, dim_size);
  const Tensor index = index32(op, "index", index_in, dim_size);
  const Csr csr = csr_by(index, dim_size);
  Tensor out = at::empty({dim_size, src.size(1)}, src.options());
  const kf::TensorView xv = view(src), rv = view(csr.rowptr), cv = view(csr.order), ov = view(out);
  kf::GatherReduceArgs a;
  a.name = op;
  a.x = &xv, a.rowptr = &rv, a.col = &cv, a.out = &ov;
  run_gather(cuda, src, a);
  return out.view(out_shape(src_in, dim_size));
}

// ---- autograd ----------------------------------------------------------------------------------------
class SegmentReduceFn : public torch::autograd::Function<SegmentReduceFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& rowptr, c10::string_view reduce) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, c10::string_view)>(
        "kernelforge::segment_reduce");
    auto [out, arg] = op.call(x, rowptr, reduce);
    ctx->saved_data["reduce"] = std::string(reduce);
    ctx->saved_data["rows"] = x.size(0);
    ctx->save_for_backward({rowptr, arg});
    ctx->mark_non_differentiable({arg});
    return {out, arg};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("segment_reduce");
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, c10::string_view, const Tensor&, int64_t)>(
        "kernelforge::segment_reduce_backward");
    const std::string reduce = ctx->saved_data["reduce"].toStringRef();
    return {op.call(grads[0].contiguous(), saved[0], reduce, saved[1], ctx->saved_data["rows"].toInt()), Tensor(),
            Tensor()};
  }
};

class GatherScatterFn : public torch::autograd::Function<GatherScatterFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& src, const Tensor& dst,
                               int64_t num_nodes, c10::string_view reduce, const OptTensor& weight) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, int64_t,
                                                                  c10::string_view, const OptTensor&)>(
        "kernelforge::gather_scatter");
    auto [out, arg, rowptr] = op.call(x, src, dst, num_nodes, reduce, weight);
    ctx->saved_data["reduce"] = std::string(reduce);
    ctx->saved_data["has_weight"] = defined(weight);
    ctx->save_for_backward({x, src, dst, rowptr, arg, defined(weight) ? *weight : Tensor()});
    ctx->mark_non_differentiable({arg, rowptr});
    return {out, arg, rowptr};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("gather_scatter");
    auto s = ctx->get_saved_variables();
    static auto op =
        op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                             c10::string_view, const OptTensor&, const Tensor&, bool, bool)>(
            "kernelforge::gather_scatter_backward");
    const std::string reduce = ctx->saved_data["reduce"].toStringRef();
    const bool has_weight = ctx->saved_data["has_weight"].toBool();
    // needs_input_grad counts tensor arguments only: x, edge_src, edge_dst, edge_weight
    const bool need_x = ctx->needs_input_grad(0), need_w = has_weight && ctx->needs_input_grad(3);
    auto [dx, dw] = op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], reduce,
                            has_weight ? OptTensor(s[5]) : std::nullopt, s[4], need_x, need_w);
    return {need_x ? dx : Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), need_w ? dw : Tensor()};
  }
};

class ScatterAddFn : public torch::autograd::Function<ScatterAddFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& src, const Tensor& index, int64_t dim_size) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, int64_t)>("kernelforge::scatter_add");
    ctx->save_for_backward({index});
    return op.call(src, index, dim_size);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // d src[e] = dout[index[e]]: a row gather, one writer per element (deterministic)
    auto saved = ctx->get_saved_variables();
    return {grads[0].index_select(0, saved[0]), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> segment_reduce_autograd(const Tensor& x, const Tensor& rowptr, c10::string_view reduce) {
  auto out = SegmentReduceFn::apply(x, rowptr, reduce);
  return {out[0], out[1]};
}
std::tuple<Tensor, Tensor, Tensor> gather_scatter_autograd(const Tensor& x, const Tensor& src, const Tensor& dst,
                                                           int64_t num_nodes, c10::string_view reduce,
                                                           const OptTensor& weight) {
  auto out = GatherScatterFn::apply(x, src, dst, num_nodes, reduce, weight);
  return {out[0], out[1], out[2]};
}
Tensor scatter_add_autograd(const Tensor& src, const Tensor& index, int64_t dim_size) {
  return ScatterAddFn::apply(src, index, dim_size);
}

}  // namespace

// reduce: "sum", "mean" or "max". argmax (int32 [N, F], max only: the row / edge id of the first
// maximum, -1 for an empty segment) and rowptr are returned for the backward.
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&segment_reduce_impl, &segment_reduce_autograd>(
      m, "segment_reduce(Tensor x, Tensor rowptr, str reduce) -> (Tensor, Tensor)");
  def_op<&segment_reduce_backward_impl>(
      m, "segment_reduce_backward(Tensor dout, Tensor rowptr, str reduce, Tensor argmax, int rows) -> Tensor");
  def_op<&gather_scatter_impl, &gather_scatter_autograd>(
      m,
      "gather_scatter(Tensor x, Tensor edge_src, Tensor edge_dst, int num_nodes, str reduce, Tensor? edge_weight) -> "
      "(Tensor, Tensor, Tensor)");
  def_op<&gather_scatter_backward_impl>(
      m,
      "gather_scatter_backward(Tensor dout, Tensor x, Tensor edge_src, Tensor edge_dst, Tensor rowptr, str reduce, "
      "Tensor? edge_weight, Tensor argmax, bool need_x, bool need_weight) -> (Tensor, Tensor)");
  def_op<&scatter_add_impl, &scatter_add_autograd>(m, "scatter_add(Tensor src, Tensor index, int dim_size) -> Tensor");
}
