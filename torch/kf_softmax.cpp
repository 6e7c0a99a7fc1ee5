// The PyTorch binding of the softmax family (include/kernelforge/softmax.h): softmax, log_softmax
// and their backward ops, over the last dimension. CUDA = our kernels, CPU = the float64 reference,
// Autograd = a C++ function that saves the output y (both backward formulas need only y and the
// incoming gradient). Fake impls: python/kernelforge/softmax.py.
#include "kernelforge/softmax.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

const char* fwd_name(bool log) { return log ? "log_softmax" : "softmax"; }
const char* bwd_name(bool log) { return log ? "log_softmax_backward" : "softmax_backward"; }

// y = softmax(x) or log_softmax(x) over the last dimension; y is contiguous.
Tensor softmax_impl(bool cuda, bool log, const Tensor& x_in) {
  if (cuda && needs_fallback(fwd_name(log), x_in)) return softmax_impl(false, log, x_in.cpu()).to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = at::empty(x.sizes(), x.options());
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(log ? kf::log_softmax(view(x), view(y), stream_of(x)) : kf::softmax(view(x), view(y), stream_of(x)));
  } else {
    check(log ? kf::ref::log_softmax(view(x), view(y)) : kf::ref::softmax(view(x), view(y)));
  }
  return y;
}

// dx from dy (= dL/dy) and the forward's output y; dx is contiguous.
Tensor softmax_backward_impl(bool cuda, bool log, const Tensor& dy_in, const Tensor& y_in) {
  if (cuda && needs_fallback(bwd_name(log), y_in))
    return softmax_backward_impl(false, log, dy_in.cpu(), y_in.cpu()).to(y_in.device());
  const Tensor dy = rows(dy_in), y = rows(y_in);
  Tensor dx = at::empty(y.sizes(), y.options());
  if (cuda) {
    // the CUDA one of the two (a CPU y next to a CUDA dy is rejected by the core with its message)
    c10::cuda::CUDAGuard guard(y.is_cuda() ? y.device() : dy.device());
    check(log ? kf::log_softmax_backward(view(dy), view(y), view(dx), stream_of(y))
              : kf::softmax_backward(view(dy), view(y), view(dx), stream_of(y)));
  } else {
    check(log ? kf::ref::log_softmax_backward(view(dy), view(y), view(dx))
              : kf::ref::softmax_backward(view(dy), view(y), view(dx)));
  }
  return dx;
}

// Saves the output y (not x): dx = y (g − Σ g y) and dx = g − exp(y) Σ g need nothing else, and y
// is the tensor the caller keeps anyway.
template <bool kLog>
class SoftmaxFn : public torch::autograd::Function<SoftmaxFn<kLog>> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&)>(kLog ? "kernelforge::log_softmax" : "kernelforge::softmax");
    Tensor y = op.call(x);
    ctx->save_for_backward({y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward(fwd_name(kLog));
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&)>(kLog ? "kernelforge::log_softmax_backward"
                                                                          : "kernelforge::softmax_backward");
    return {op.call(dense(grads[0]), saved[0])};
  }
};

// Without a gradient to record (no_grad / inference, or x not requiring one) the op goes straight to
// the kernel: no autograd Function, context or saved tensor on the host path of a decode-sized call.
template <bool kLog>
Tensor softmax_autograd(const Tensor& x) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&)>(kLog ? "kernelforge::log_softmax" : "kernelforge::softmax");
    return op.call(x);
  }
  return SoftmaxFn<kLog>::apply(x);
}

Tensor softmax_fwd(bool cuda, const Tensor& x) { return softmax_impl(cuda, false, x); }
Tensor log_softmax_fwd(bool cuda, const Tensor& x) { return softmax_impl(cuda, true, x); }
Tensor softmax_bwd(bool cuda, const Tensor& dy, const Tensor& y) { return softmax_backward_impl(cuda, false, dy, y); }
Tensor log_softmax_bwd(bool cuda, const Tensor& dy, const Tensor& y) {
  return softmax_backward_impl(cuda, true, dy, y);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&softmax_fwd, &softmax_autograd<false>>(m, "softmax(Tensor x) -> Tensor");
  def_op<&softmax_bwd>(m, "softmax_backward(Tensor dy, Tensor y) -> Tensor");
  def_op<&log_softmax_fwd, &softmax_autograd<true>>(m, "log_softmax(Tensor x) -> Tensor");
  def_op<&log_softmax_bwd>(m, "log_softmax_backward(Tensor dy, Tensor y) -> Tensor");
}
