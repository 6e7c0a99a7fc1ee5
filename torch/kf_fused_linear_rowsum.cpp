// The PyTorch binding of the fused_linear_rowsum family (include/kernelforge/fused_linear_rowsum.h):
// fused_linear_rowsum(x, weight, bias) = F.linear(x, weight, bias).sum(-1) without the [..., O]
// product, its forward (which also returns w_sum, kept for the backward) and backward ops. CUDA = our
// kernels, CPU = the float64 reference, Autograd = FlrsFn below. Fake impls:
// python/kernelforge/fused_linear_rowsum.py.
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/fused_linear_rowsum.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

int64_t leading(const Tensor& x) {
  int64_t t = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) t *= x.size(d);
  return t;
}

// x.shape[:-1] (a 0-dimensional x is left for the core to reject with its message).
std::vector<int64_t> rows_shape(const Tensor& x) {
  auto sizes = x.sizes().vec();
  if (!sizes.empty()) sizes.pop_back();
  return sizes;
}

// dy as the kernels take it: dimensions that collapse into one stride (a contiguous tensor, or the
// broadcast gradient of a sum, stride 0), else a contiguous copy (T elements: nothing next to x).
Tensor one_stride(const Tensor& t) {
  int64_t expect = -1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expect >= 0 && t.stride(d) != expect) return t.contiguous();
    expect = t.stride(d) * t.size(d);
  }
  return t;
}

// (y, w_sum): w_sum float32 [K] (float64 for the float64 reference).
std::tuple<Tensor, Tensor> forward_impl(bool cuda, const Tensor& x_in, const Tensor& weight_in, const OptTensor& bias) {
  if (cuda && needs_fallback("fused_linear_rowsum", x_in)) {
    auto [y, ws] = forward_impl(false, x_in.cpu(), weight_in.cpu(), to_cpu(bias));
    return {y.to(x_in.device()), ws.to(x_in.device())};
  }
  const Tensor x = rows(x_in), w = rows(weight_in);
  const int64_t k = x.dim() > 0 ? x.size(-1) : 0;
  Tensor y = at::empty(rows_shape(x), x.options());
  Tensor w_sum = at::empty({k}, x.options().dtype(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
  const OptView b(bias);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t o = w.dim() == 2 ? w.size(0) : 0;
    const Tensor ws = workspace(x, kf::fused_linear_rowsum_workspace_size(leading(x), k, o));
    check(kf::fused_linear_rowsum(view(x), view(w), b.get(), view(y), view(w_sum), ws.data_ptr(), size_t(ws.numel()),
                                  stream_of(x)));
  } else {
    check(kf::ref::fused_linear_rowsum(view(x), view(w), b.get(), view(y), view(w_sum)));
  }
  return {y, w_sum};
}

Tensor impl(bool cuda, const Tensor& x, const Tensor& weight, const OptTensor& bias) {
  return std::get<0>(forward_impl(cuda, x, weight, bias));
}

// (dx, dweight, dbias); a gradient not asked for is an empty [0] tensor. weight gives only the shape
// of dweight and dbias ([O, K], [O]): it is not read.
std::tuple<Tensor, Tensor, Tensor> backward_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in,
                                                 const Tensor& w_sum, const Tensor& weight, bool grad_x,
                                                 bool grad_weight, bool grad_bias) {
  if (cuda && needs_fallback("fused_linear_rowsum_backward", x_in)) {
    auto [dx, dw, db] = backward_impl(false, dy_in.cpu(), x_in.cpu(), w_sum.cpu(), at::empty(weight.sizes()), grad_x,
                                      grad_weight, grad_bias);
    return {dx.to(x_in.device()), dw.to(x_in.device()), db.to(x_in.device())};
  }
  const Tensor x = rows(x_in), dy = one_stride(dy_in);
  const int64_t o = weight.dim() > 0 ? weight.size(0) : 0;
  Tensor dx = grad_x ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  Tensor dw = grad_weight ? at::empty(weight.sizes(), x.options()) : at::empty({0}, x.options());
  Tensor db = grad_bias ? at::empty({o}, x.options()) : at::empty({0}, x.options());
  const kf::TensorView dxv = view(dx), dwv = view(dw), dbv = view(db);
  const kf::TensorView* dxp = grad_x ? &dxv : nullptr;
  const kf::TensorView* dwp = grad_weight ? &dwv : nullptr;
  const kf::TensorView* dbp = grad_bias ? &dbv : nullptr;
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t k = x.dim() > 0 ? x.size(-1) : 0;
    const Tensor ws = workspace(x, kf::fused_linear_rowsum_workspace_size(leading(x), k, o));
    check(kf::fused_linear_rowsum_backward(view(dy), view(x), view(w_sum), dxp, dwp, dbp, ws.data_ptr(),
                                           size_t(ws.numel()), stream_of(x)));
  } else {
    check(kf::ref::fused_linear_rowsum_backward(view(dy), view(x), view(w_sum), dxp, dwp, dbp));
  }
  return {dx, dw, db};
}

// ---- autograd: the forward keeps x and w_sum ([K] float32) rather than re-reading W; weight is saved
// for its shape only (a parameter: no extra memory) ---------------------------------------------------
using FwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&);
using BwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                                                  bool, bool);

class FlrsFn : public torch::autograd::Function<FlrsFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight, const OptTensor& bias) {
    const bool gx = x.requires_grad(), gw = weight.requires_grad(), gb = defined(bias) && bias->requires_grad();
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<FwdSig>("kernelforge::fused_linear_rowsum_forward");
    auto [y, w_sum] = op.call(x, weight, bias);
    ctx->save_for_backward({x, w_sum, weight});
    ctx->saved_data["flags"] = int64_t(gx) | int64_t(gw) << 1 | int64_t(gb) << 2;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("fused_linear_rowsum");
    auto s = ctx->get_saved_variables();
    const int64_t flags = ctx->saved_data["flags"].toInt();
    const bool gx = flags & 1, gw = flags & 2, gb = flags & 4;
    static auto op = op_handle<BwdSig>("kernelforge::fused_linear_rowsum_backward");
    auto [dx, dw, db] = op.call(grads[0], s[0], s[1], s[2], gx, gw, gb);
    // (not grad_or_empty: numel() is symbolic under torch.compile's dynamic shapes; the flags say it)
    return {gx ? dx : Tensor(), gw ? dw : Tensor(), gb ? db : Tensor()};
  }
};

Tensor autograd_impl(const Tensor& x, const Tensor& weight, const OptTensor& bias) {
  return FlrsFn::apply(x, weight, bias);
}

}  // namespace

// fused_linear_rowsum(x [..., K], weight [O, K], bias [O]?) -> y x.shape[:-1]. _forward also returns
// w_sum [K] (float32); _backward takes it and returns (dx, dweight, dbias), [0] for those not asked.
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&impl, &autograd_impl>(m, "fused_linear_rowsum(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  def_op<&forward_impl>(m, "fused_linear_rowsum_forward(Tensor x, Tensor weight, Tensor? bias) -> (Tensor, Tensor)");
  def_op<&backward_impl>(m,
                         "fused_linear_rowsum_backward(Tensor dy, Tensor x, Tensor w_sum, Tensor weight, bool grad_x, "
                         "bool grad_weight, bool grad_bias) -> (Tensor, Tensor, Tensor)");
}
