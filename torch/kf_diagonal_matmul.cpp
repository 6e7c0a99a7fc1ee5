// The PyTorch binding of the diagonal_matmul family (include/kernelforge/diagonal_matmul.h):
// diagonal_matmul and diagonal_matmul_backward. CUDA = our kernels, CPU = the float64 reference.
// Fake impls and autograd (of both ops: double backward works): python/kernelforge/diagonal_matmul.py.
#include <tuple>

#include "kernelforge/diagonal_matmul.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

// a as the core takes it: dimensions that collapse into one stride (a 1-D a always does).
Tensor scales(const Tensor& a) { return a.dim() > 1 ? a.contiguous() : a; }

Tensor diagonal_matmul_impl(bool cuda, const Tensor& a_in, const Tensor& b_in) {
  if (cuda && needs_fallback("diagonal_matmul", b_in))
    return diagonal_matmul_impl(false, a_in.cpu(), b_in.cpu()).to(b_in.device());
  const Tensor a = scales(a_in), b = rows(b_in);
  Tensor y = empty_like_rows(b);
  if (cuda) {
    c10::cuda::CUDAGuard guard(b.device());
    check(kf::diagonal_matmul(view(a), view(b), view(y), stream_of(b)));
  } else {
    check(kf::ref::diagonal_matmul(view(a), view(b), view(y)));
  }
  return y;
}

// (da, db); a gradient not asked for is an empty [0] tensor and is not computed.
std::tuple<Tensor, Tensor> diagonal_matmul_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& a_in,
                                                         const Tensor& b_in, bool need_a, bool need_b) {
  if (cuda && needs_fallback("diagonal_matmul_backward", b_in)) {
    auto out = diagonal_matmul_backward_impl(false, dy_in.cpu(), a_in.cpu(), b_in.cpu(), need_a, need_b);
    return {std::get<0>(out).to(b_in.device()), std::get<1>(out).to(b_in.device())};
  }
  const Tensor a = scales(a_in), b = rows(b_in), dy = rows(dense(dy_in));
  Tensor da = need_a ? at::empty(a.sizes(), a.options()) : at::empty({0}, a.options());
  Tensor db = need_b ? empty_like_rows(b) : at::empty({0}, b.options());
  const kf::TensorView dav = view(da), dbv = view(db);
  const kf::TensorView* dap = need_a ? &dav : nullptr;
  const kf::TensorView* dbp = need_b ? &dbv : nullptr;
  if (!need_a && !need_b) return {da, db};
  if (cuda) {
    c10::cuda::CUDAGuard guard(b.device());
    size_t bytes = 0;
    check(kf::diagonal_matmul_backward(view(dy), view(a), view(b), dap, dbp, nullptr, &bytes, nullptr));
    Tensor ws = workspace(b, bytes);
    check(kf::diagonal_matmul_backward(view(dy), view(a), view(b), dap, dbp, ws.data_ptr(), &bytes, stream_of(b)));
  } else {
    check(kf::ref::diagonal_matmul_backward(view(dy), view(a), view(b), dap, dbp));
  }
  return {da, db};
}

}  // namespace

// a: b.shape[:-1] (one scale per row) or [M] (broadcast over b's batch dimensions); y = a[..., None] * b.
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&diagonal_matmul_impl>(m, "diagonal_matmul(Tensor a, Tensor b) -> Tensor");
  def_op<&diagonal_matmul_backward_impl>(
      m,
      "diagonal_matmul_backward(Tensor dy, Tensor a, Tensor b, bool need_a=True, bool need_b=True) -> (Tensor, "
      "Tensor)");
}
