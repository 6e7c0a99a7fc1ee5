// The PyTorch binding of the linear family (include/kernelforge/linear.h): kernelforge::linear, nn.Linear's
// y = x W^T (+ bias) for the few rows of a decode step. CUDA = the skinny kernel (M <= 16 rows; the core
// refuses more, and python/kernelforge/linear.py sends larger M to cuBLAS before it gets here), CPU = the
// float64 reference (any M). Autograd = LinearFn below, whose backward is three torch ops (cuBLAS on CUDA):
// dx = dy W, dW = dy^T x, dbias = the sum of dy over the rows; they are differentiable, so double backward
// works too. Fake impl: python/kernelforge/linear.py.
//
// x [..., K] (any strides: its leading dims flattened into M rows, a view when they collapse into one row
// stride, else a copy); w [N, K] (any row stride, the last dimension contiguous); bias [N] or None;
// y [..., N] contiguous in x's dtype.
#include <string>
#include <vector>

#include "kernelforge/linear.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

// x [..., K] as rows [M, K] (a 1-D x is one row): a view when the leading dims collapse into one row
// stride and the last one is contiguous, else a copy (of at most 16 rows on CUDA: cheap, unlike a copy
// of w, whose strided last dimension the core refuses instead). M from the leading sizes: K = 0 works.
Tensor as_rows(const Tensor& x, int64_t m) {
  const Tensor r = x.size(-1) > 1 && x.stride(-1) != 1 ? x.contiguous() : rows(x);
  return x.dim() == 2 ? r : r.reshape({m, x.size(-1)});
}

int64_t leading_rows(const Tensor& x) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) m *= x.size(d);
  return m;
}

Tensor linear_impl(bool cuda, const Tensor& x_in, const Tensor& w, const OptTensor& bias) {
  if (cuda && needs_fallback("linear", x_in))
    return linear_impl(false, x_in.cpu(), w.cpu(), to_cpu(bias)).to(x_in.device());
  // y's shape is read from x and w: ranks that do not give one are refused here (everything else, the
  // dtypes, K and bias's shape included, by the core). One std::string message: see kf_attention.cpp.
  if (x_in.dim() < 1) TORCH_CHECK_VALUE(false, "linear: x must have at least 1 dimension [..., K], got a scalar");
  if (w.dim() != 2)
    TORCH_CHECK_VALUE(false,
                      "linear: w must have 2 dimensions [N, K] (nn.Linear's weight), got " + std::to_string(w.dim()));
  const int64_t m = leading_rows(x_in), n = w.size(0);
  std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
  out_shape.back() = n;
  const Tensor x = as_rows(x_in, m);
  Tensor y = at::empty({m, n}, x.options());

  const kf::TensorView xv = view(x), wv = view(w), yv = view(y);
  const OptView bv(bias);
  kf::LinearTensors t;
  t.x = &xv;
  t.w = &wv;
  t.bias = bv.get();
  t.y = &yv;
  if (!cuda) {
    check(kf::ref::linear(t));
    return y.view(out_shape);
  }
  c10::cuda::CUDAGuard guard(x.device());
  // Plan (host only: shapes, strides, the device), then the split-K workspace from the caching
  // allocator when the plan needs one: stream-ordered on the current stream, no host synchronization,
  // so a CUDA graph captures the call.
  kf::LinearPlan plan;
  size_t bytes = 0;
  check(kf::linear_plan(t, &plan, &bytes));
  Tensor ws = bytes > 0 ? workspace(x, bytes) : Tensor();
  check(kf::linear(plan, t, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream_of(x)));
  return y.view(out_shape);
}

// ---- autograd ------------------------------------------------------------------------------------
class LinearFn : public torch::autograd::Function<LinearFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const OptTensor& bias) {
    ctx->saved_data["bias"] = defined(bias);
    ctx->save_for_backward({x, w});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, const OptTensor&)>("kernelforge::linear");
    return op.call(x, w, bias);
  }
  // torch's GEMMs (cuBLAS on CUDA): the backward of a decode step's few rows is not this family's work.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &dy = grads[0];
    const int64_t m = leading_rows(x), n = w.size(0), k = w.size(1);
    const Tensor dy2 = dy.reshape({m, n});
    Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::matmul(dy, w);  // [..., K]
    if (ctx->needs_input_grad(1)) dw = at::mm(dy2.t(), x.reshape({m, k}));
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) db = dy2.sum(0);
    return {dx, dw, db};
  }
};

Tensor linear_autograd(const Tensor& x, const Tensor& w, const OptTensor& bias) { return LinearFn::apply(x, w, bias); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&linear_impl, &linear_autograd>(m, "linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
}
