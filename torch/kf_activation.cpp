// The PyTorch binding of the activation family (include/kernelforge/activation.h): silu_and_mul,
// swiglu, gelu_and_mul, geglu, gelu and their backward ops, and gelu_backward_bias_grad (GELU's
// backward with the column sums of its gradient: the bias gradient of kernelforge.linear's backward).
// CUDA = our kernels, CPU = the float64 reference, Autograd = the C++ functions below. Fake impls:
// python/kernelforge/activation.py.
#include <optional>
#include <string>
#include <tuple>

#include "kernelforge/activation.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

// ---- forward and backward (cuda = our kernels, otherwise the float64 reference) ------------------------
// approximate is F.gelu's: "none" (erf) or "tanh"
constexpr EnumName<kf::GeluApprox> kGeluApprox[] = {{"none", kf::GeluApprox::kNone}, {"tanh", kf::GeluApprox::kTanh}};
kf::GeluApprox gelu_approx(const char* op, c10::string_view approximate) {
  return parse_enum(op, "approximate", approximate, kGeluApprox);
}

// y of the [..., 2I] ops: x's shape with the last dimension halved (an odd one is left for the core
// to reject with its message; the empty placeholder is never written).
Tensor empty_half(const Tensor& x) {
  auto sizes = x.sizes().vec();
  if (!sizes.empty()) sizes.back() = sizes.back() / 2;
  return at::empty(sizes, x.options());
}

Tensor silu_and_mul_impl(bool cuda, const Tensor& x_in) {
  if (cuda && needs_fallback("silu_and_mul", x_in)) return silu_and_mul_impl(false, x_in.cpu()).to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = empty_half(x);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::silu_and_mul(view(x), view(y), stream_of(x)));
  } else {
    check(kf::ref::silu_and_mul(view(x), view(y)));
  }
  return y;
}

Tensor swiglu_impl(bool cuda, const Tensor& g_in, const Tensor& u_in) {
  if (cuda && needs_fallback("swiglu", g_in)) return swiglu_impl(false, g_in.cpu(), u_in.cpu()).to(g_in.device());
  const Tensor g = rows(g_in), u = rows(u_in);
  Tensor y = empty_like_rows(g);
  if (cuda) {
    c10::cuda::CUDAGuard guard(g.device());
    check(kf::swiglu(view(g), view(u), view(y), stream_of(g)));
  } else {
    check(kf::ref::swiglu(view(g), view(u), view(y)));
  }
  return y;
}

Tensor gelu_and_mul_impl(bool cuda, const Tensor& x_in, c10::string_view approximate, bool gate_first) {
  const kf::GeluApprox a = gelu_approx("gelu_and_mul", approximate);
  if (cuda && needs_fallback("gelu_and_mul", x_in))
    return gelu_and_mul_impl(false, x_in.cpu(), approximate, gate_first).to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = empty_half(x);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::gelu_and_mul(view(x), a, gate_first, view(y), stream_of(x)));
  } else {
    check(kf::ref::gelu_and_mul(view(x), a, gate_first, view(y)));
  }
  return y;
}

Tensor geglu_impl(bool cuda, const Tensor& h_in, const Tensor& g_in, c10::string_view approximate) {
  const kf::GeluApprox a = gelu_approx("geglu", approximate);
  if (cuda && needs_fallback("geglu", h_in))
    return geglu_impl(false, h_in.cpu(), g_in.cpu(), approximate).to(h_in.device());
  const Tensor h = rows(h_in), g = rows(g_in);
  Tensor y = empty_like_rows(h);
  if (cuda) {
    c10::cuda::CUDAGuard guard(h.device());
    check(kf::geglu(view(h), view(g), a, view(y), stream_of(h)));
  } else {
    check(kf::ref::geglu(view(h), view(g), a, view(y)));
  }
  return y;
}

Tensor gelu_impl(bool cuda, const Tensor& x_in, c10::string_view approximate) {
  const kf::GeluApprox a = gelu_approx("gelu", approximate);
  if (cuda && needs_fallback("gelu", x_in)) return gelu_impl(false, x_in.cpu(), approximate).to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = empty_like_rows(x);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::gelu(view(x), a, view(y), stream_of(x)));
  } else {
    check(kf::ref::gelu(view(x), a, view(y)));
  }
  return y;
}

Tensor silu_and_mul_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in) {
  if (cuda && needs_fallback("silu_and_mul_backward", x_in))
    return silu_and_mul_backward_impl(false, dy_in.cpu(), x_in.cpu()).to(x_in.device());
  const Tensor x = rows(x_in), dy = rows(dy_in);
  Tensor dx = empty_like_rows(x);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::silu_and_mul_backward(view(dy), view(x), view(dx), stream_of(x)));
  } else {
    check(kf::ref::silu_and_mul_backward(view(dy), view(x), view(dx)));
  }
  return dx;
}

std::tuple<Tensor, Tensor> swiglu_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& g_in,
                                                const Tensor& u_in) {
  if (cuda && needs_fallback("swiglu_backward", g_in)) {
    auto out = swiglu_backward_impl(false, dy_in.cpu(), g_in.cpu(), u_in.cpu());
    return {std::get<0>(out).to(g_in.device()), std::get<1>(out).to(g_in.device())};
  }
  const Tensor g = rows(g_in), u = rows(u_in), dy = rows(dy_in);
  Tensor dg = empty_like_rows(g), du = empty_like_rows(u);
  if (cuda) {
    c10::cuda::CUDAGuard guard(g.device());
    check(kf::swiglu_backward(view(dy), view(g), view(u), view(dg), view(du), stream_of(g)));
  } else {
    check(kf::ref::swiglu_backward(view(dy), view(g), view(u), view(dg), view(du)));
  }
  return {dg, du};
}

Tensor gelu_and_mul_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in, c10::string_view approximate,
                                  bool gate_first) {
  const kf::GeluApprox a = gelu_approx("gelu_and_mul_backward", approximate);
  if (cuda && needs_fallback("gelu_and_mul_backward", x_in))
    return gelu_and_mul_backward_impl(false, dy_in.cpu(), x_in.cpu(), approximate, gate_first).to(x_in.device());
  const Tensor x = rows(x_in), dy = rows(dy_in);
  Tensor dx = empty_like_rows(x);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::gelu_and_mul_backward(view(dy), view(x), a, gate_first, view(dx), stream_of(x)));
  } else {
    check(kf::ref::gelu_and_mul_backward(view(dy), view(x), a, gate_first, view(dx)));
  }
  return dx;
}

std::tuple<Tensor, Tensor> geglu_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& h_in, const Tensor& g_in,
                                               c10::string_view approximate) {
  const kf::GeluApprox a = gelu_approx("geglu_backward", approximate);
  if (cuda && needs_fallback("geglu_backward", h_in)) {
    auto out = geglu_backward_impl(false, dy_in.cpu(), h_in.cpu(), g_in.cpu(), approximate);
    return {std::get<0>(out).to(h_in.device()), std::get<1>(out).to(h_in.device())};
  }
  const Tensor h = rows(h_in), g = rows(g_in), dy = rows(dy_in);
  Tensor dh = empty_like_rows(h), dg = empty_like_rows(g);
  if (cuda) {
    c10::cuda::CUDAGuard guard(h.device());
    check(kf::geglu_backward(view(dy), view(h), view(g), a, view(dh), view(dg), stream_of(h)));
  } else {
    check(kf::ref::geglu_backward(view(dy), view(h), view(g), a, view(dh), view(dg)));
  }
  return {dh, dg};
}

Tensor gelu_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in, c10::string_view approximate) {
  const kf::GeluApprox a = gelu_approx("gelu_backward", approximate);
  if (cuda && needs_fallback("gelu_backward", x_in))
    return gelu_backward_impl(false, dy_in.cpu(), x_in.cpu(), approximate).to(x_in.device());
  const Tensor x = rows(x_in), dy = rows(dy_in);
  Tensor dx = empty_like_rows(x);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::gelu_backward(view(dy), view(x), a, view(dx), stream_of(x)));
  } else {
    check(kf::ref::gelu_backward(view(dy), view(x), a, view(dx)));
  }
  return dx;
}

// (dx, dbias): dbias [N] in bias_dtype (default: x's dtype); the float32 partial sums of the CUDA
// kernels live in a workspace from the caching allocator.
std::tuple<Tensor, Tensor> gelu_backward_bias_grad_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in,
                                                        c10::string_view approximate,
                                                        std::optional<at::ScalarType> bias_dtype) {
  const kf::GeluApprox a = gelu_approx("gelu_backward_bias_grad", approximate);
  if (cuda && needs_fallback("gelu_backward_bias_grad", x_in)) {
    auto [dx, db] = gelu_backward_bias_grad_impl(false, dy_in.cpu(), x_in.cpu(), approximate, bias_dtype);
    return {dx.to(x_in.device()), db.to(x_in.device())};
  }
  const Tensor x = rows(x_in), dy = rows(dy_in);
  const int64_t n = x.dim() > 0 ? x.size(-1) : 0;  // (a 0-dimensional x is left for the core to reject)
  Tensor dx = empty_like_rows(x);
  Tensor db = at::empty({n}, x.options().dtype(bias_dtype.value_or(x.scalar_type())));
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t m = n > 0 ? x.numel() / n : 0;
    const Tensor ws = workspace(x, kf::gelu_backward_bias_grad_workspace_size(m, n));
    check(kf::gelu_backward_bias_grad(view(dy), view(x), a, view(dx), view(db), ws.data_ptr(), size_t(ws.numel()),
                                      stream_of(x)));
  } else {
    check(kf::ref::gelu_backward_bias_grad(view(dy), view(x), a, view(dx), view(db)));
  }
  return {dx, db};
}

// ---- autograd: the forward saves its inputs, the backward recomputes act(a) from them (no extra
// activation tensor is kept), one fused kernel per direction -------------------------------------
class SiluAndMulFn : public torch::autograd::Function<SiluAndMulFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&)>("kernelforge::silu_and_mul");
    return op.call(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("silu_and_mul");
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&)>("kernelforge::silu_and_mul_backward");
    return {op.call(dense(grads[0]), saved[0])};
  }
};

class SwigluFn : public torch::autograd::Function<SwigluFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& gate, const Tensor& up) {
    ctx->save_for_backward({gate, up});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&)>("kernelforge::swiglu");
    return op.call(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("swiglu");
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&)>(
        "kernelforge::swiglu_backward");
    auto [dg, du] = op.call(dense(grads[0]), saved[0], saved[1]);
    return {dg, du};
  }
};

class GeluAndMulFn : public torch::autograd::Function<GeluAndMulFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, c10::string_view approximate, bool gate_first) {
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->saved_data["gate_first"] = gate_first;
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, c10::string_view, bool)>("kernelforge::gelu_and_mul");
    return op.call(x, approximate, gate_first);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("gelu_and_mul");
    auto saved = ctx->get_saved_variables();
    static auto op =
        op_handle<Tensor(const Tensor&, const Tensor&, c10::string_view, bool)>("kernelforge::gelu_and_mul_backward");
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {op.call(dense(grads[0]), saved[0], approximate, ctx->saved_data["gate_first"].toBool()), Tensor(),
            Tensor()};
  }
};

class GegluFn : public torch::autograd::Function<GegluFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& gate, c10::string_view approximate) {
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->save_for_backward({hidden, gate});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, c10::string_view)>("kernelforge::geglu");
    return op.call(hidden, gate, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("geglu");
    auto saved = ctx->get_saved_variables();
    static auto op =
        op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, c10::string_view)>(
            "kernelforge::geglu_backward");
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    auto [dh, dg] = op.call(dense(grads[0]), saved[0], saved[1], approximate);
    return {dh, dg, Tensor()};
  }
};

class GeluFn : public torch::autograd::Function<GeluFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, c10::string_view approximate) {
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, c10::string_view)>("kernelforge::gelu");
    return op.call(x, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("gelu");
    auto saved = ctx->get_saved_variables();
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, c10::string_view)>("kernelforge::gelu_backward");
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {op.call(dense(grads[0]), saved[0], approximate), Tensor()};
  }
};

Tensor silu_and_mul_autograd(const Tensor& x) { return SiluAndMulFn::apply(x); }
Tensor swiglu_autograd(const Tensor& g, const Tensor& u) { return SwigluFn::apply(g, u); }
Tensor gelu_and_mul_autograd(const Tensor& x, c10::string_view a, bool gate_first) {
  return GeluAndMulFn::apply(x, a, gate_first);
}
Tensor geglu_autograd(const Tensor& h, const Tensor& g, c10::string_view a) { return GegluFn::apply(h, g, a); }
Tensor gelu_autograd(const Tensor& x, c10::string_view a) { return GeluFn::apply(x, a); }

}  // namespace

// approximate is F.gelu's: "none" (erf) or "tanh". The [..., 2I] ops return [..., I].
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&silu_and_mul_impl, &silu_and_mul_autograd>(m, "silu_and_mul(Tensor x) -> Tensor");
  def_op<&silu_and_mul_backward_impl>(m, "silu_and_mul_backward(Tensor dy, Tensor x) -> Tensor");
  def_op<&swiglu_impl, &swiglu_autograd>(m, "swiglu(Tensor gate, Tensor up) -> Tensor");
  def_op<&swiglu_backward_impl>(m, "swiglu_backward(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  def_op<&gelu_and_mul_impl, &gelu_and_mul_autograd>(
      m, "gelu_and_mul(Tensor x, str approximate=\"tanh\", bool gate_first=True) -> Tensor");
  def_op<&gelu_and_mul_backward_impl>(
      m, "gelu_and_mul_backward(Tensor dy, Tensor x, str approximate, bool gate_first) -> Tensor");
  def_op<&geglu_impl, &geglu_autograd>(m, "geglu(Tensor hidden, Tensor gate, str approximate=\"none\") -> Tensor");
  def_op<&geglu_backward_impl>(
      m, "geglu_backward(Tensor dy, Tensor hidden, Tensor gate, str approximate) -> (Tensor, Tensor)");
  def_op<&gelu_impl, &gelu_autograd>(m, "gelu(Tensor x, str approximate=\"none\") -> Tensor");
  def_op<&gelu_backward_impl>(m, "gelu_backward(Tensor dy, Tensor x, str approximate) -> Tensor");
  // (dx, dbias): gelu_backward's dx and its column sums, dbias [N] in bias_dtype (None: x's dtype)
  def_op<&gelu_backward_bias_grad_impl>(m,
                                        "gelu_backward_bias_grad(Tensor dy, Tensor x, str approximate, "
                                        "ScalarType? bias_dtype=None) -> (Tensor, Tensor)");
}
