// The PyTorch binding (with kf_softmax.cpp and kf_torch_util.h, the only files that include torch
// headers). It registers the kernelforge::* ops of the norm, activation and rope families (schemas, CUDA impl = our
// kernels, CPU impl = the float64 C++ reference, Autograd = C++ autograd functions, so a call has no Python frame below
// the functional wrapper). Fake impls are registered in Python (python/kernelforge/_ops.py). Every check lives in the
// C++ core; this file only converts tensors to views, allocates outputs with PyTorch's allocator and picks the stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>

#include "kernelforge/activation.h"
#include "kernelforge/norm.h"
#include "kernelforge/rope.h"
#include "kf_torch_util.h"

namespace kf = kernelforge;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

namespace {

// view, check, rows, stream_of, needs_fallback, op_handle, no_double_backward, dense: kf_torch_util.h
using namespace kf_torch;

struct OptView {  // a view that may be absent
  kf::TensorView v;
  bool present = false;
  explicit OptView(const OptTensor& t) {
    if (t.has_value() && t->defined()) {
      v = view(*t);
      present = true;
    }
  }
  const kf::TensorView* get() const { return present ? &v : nullptr; }
};

Tensor empty_like_rows(const Tensor& x) { return at::empty(x.sizes(), x.options()); }
Tensor empty_param(const OptTensor& p, const Tensor& x) {
  return p.has_value() && p->defined() ? at::empty(p->sizes(), p->options()) : at::empty({0}, x.options());
}

OptTensor to_cpu(const OptTensor& t) { return t.has_value() && t->defined() ? OptTensor(t->cpu()) : t; }

Tensor workspace(const Tensor& x, size_t bytes) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))}, x.options().dtype(at::kByte));
}

// ---- forward impls (cuda = kernels, else the reference) ------------------------------------
Tensor rms_norm_impl(bool cuda, const Tensor& x_in, const OptTensor& weight, double eps);
std::tuple<Tensor, Tensor> add_rms_norm_impl(bool cuda, const Tensor& x_in, const Tensor& r_in, const OptTensor& weight,
                                             double eps);
Tensor layer_norm_impl(bool cuda, const Tensor& x_in, const OptTensor& weight, const OptTensor& bias, double eps);
Tensor ada_norm_impl(bool cuda, const Tensor& x_in, const Tensor& scale, const Tensor& shift, const OptTensor& weight,
                     const OptTensor& bias, double eps, int64_t kind);

Tensor rms_norm_impl(bool cuda, const Tensor& x_in, const OptTensor& weight, double eps) {
  if (cuda && needs_fallback("rms_norm", x_in))
    return rms_norm_impl(false, x_in.cpu(), to_cpu(weight), eps).to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = empty_like_rows(x);
  OptView w(weight);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::rms_norm(view(x), w.get(), float(eps), view(y), stream_of(x)));
  } else {
    check(kf::ref::rms_norm(view(x), w.get(), float(eps), view(y)));
  }
  return y;
}

std::tuple<Tensor, Tensor> add_rms_norm_impl(bool cuda, const Tensor& x_in, const Tensor& r_in, const OptTensor& weight,
                                             double eps) {
  if (cuda && needs_fallback("add_rms_norm", x_in)) {
    auto out = add_rms_norm_impl(false, x_in.cpu(), r_in.cpu(), to_cpu(weight), eps);
    return {std::get<0>(out).to(x_in.device()), std::get<1>(out).to(x_in.device())};
  }
  const Tensor x = rows(x_in), r = rows(r_in);
  Tensor y = empty_like_rows(x), s = empty_like_rows(x);
  OptView w(weight);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::add_rms_norm(view(x), view(r), w.get(), float(eps), view(y), view(s), stream_of(x)));
  } else {
    check(kf::ref::add_rms_norm(view(x), view(r), w.get(), float(eps), view(y), view(s)));
  }
  return {y, s};
}

Tensor layer_norm_impl(bool cuda, const Tensor& x_in, const OptTensor& weight, const OptTensor& bias, double eps) {
  if (cuda && needs_fallback("layer_norm", x_in))
    return layer_norm_impl(false, x_in.cpu(), to_cpu(weight), to_cpu(bias), eps).to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = empty_like_rows(x);
  OptView w(weight), b(bias);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::layer_norm(view(x), w.get(), b.get(), float(eps), view(y), stream_of(x)));
  } else {
    check(kf::ref::layer_norm(view(x), w.get(), b.get(), float(eps), view(y)));
  }
  return y;
}

kf::NormKind norm_kind(int64_t kind) {
  TORCH_CHECK(kind == 0 || kind == 1, "ada_norm: kind must be 0 (rms) or 1 (layer), got ", kind);
  return kind == 0 ? kf::NormKind::kRms : kf::NormKind::kLayer;
}

Tensor ada_norm_impl(bool cuda, const Tensor& x_in, const Tensor& scale, const Tensor& shift, const OptTensor& weight,
                     const OptTensor& bias, double eps, int64_t kind) {
  const kf::NormKind k = norm_kind(kind);
  if (cuda && needs_fallback("ada_norm", x_in))
    return ada_norm_impl(false, x_in.cpu(), scale.cpu(), shift.cpu(), to_cpu(weight), to_cpu(bias), eps, kind)
        .to(x_in.device());
  const Tensor x = rows(x_in);
  Tensor y = empty_like_rows(x);
  OptView w(weight), b(bias);
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::ada_norm(view(x), view(scale), view(shift), w.get(), b.get(), float(eps), k, view(y), stream_of(x)));
  } else {
    check(kf::ref::ada_norm(view(x), view(scale), view(shift), w.get(), b.get(), float(eps), k, view(y)));
  }
  return y;
}

// ---- backward impls -------------------------------------------------------------------------
std::tuple<Tensor, Tensor> rms_norm_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in,
                                                  const OptTensor& weight, double eps) {
  if (cuda && needs_fallback("rms_norm_backward", x_in)) {
    auto out = rms_norm_backward_impl(false, dy_in.cpu(), x_in.cpu(), to_cpu(weight), eps);
    return {std::get<0>(out).to(x_in.device()), std::get<1>(out).to(x_in.device())};
  }
  const Tensor x = rows(x_in), dy = rows(dy_in);
  Tensor dx = empty_like_rows(x), dw = empty_param(weight, x);
  OptView w(weight);
  const kf::TensorView dwv = view(dw);
  const kf::TensorView* dwp = w.present ? &dwv : nullptr;
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    size_t bytes = 0;
    check(kf::rms_norm_backward(view(dy), view(x), w.get(), float(eps), view(dx), dwp, nullptr, &bytes, nullptr));
    Tensor ws = workspace(x, bytes);
    check(kf::rms_norm_backward(view(dy), view(x), w.get(), float(eps), view(dx), dwp, ws.data_ptr(), &bytes,
                                stream_of(x)));
  } else {
    check(kf::ref::rms_norm_backward(view(dy), view(x), w.get(), float(eps), view(dx), dwp));
  }
  return {dx, dw};
}

std::tuple<Tensor, Tensor> add_rms_norm_backward_impl(bool cuda, const Tensor& dy_in, const OptTensor& dsum_in,
                                                      const Tensor& sum_in, const OptTensor& weight, double eps) {
  if (cuda && needs_fallback("add_rms_norm_backward", sum_in)) {
    auto out = add_rms_norm_backward_impl(false, dy_in.cpu(), to_cpu(dsum_in), sum_in.cpu(), to_cpu(weight), eps);
    return {std::get<0>(out).to(sum_in.device()), std::get<1>(out).to(sum_in.device())};
  }
  const Tensor s = rows(sum_in), dy = rows(dy_in);
  OptTensor dsum = dsum_in.has_value() && dsum_in->defined() ? OptTensor(rows(*dsum_in)) : std::nullopt;
  Tensor dx = empty_like_rows(s), dw = empty_param(weight, s);
  OptView w(weight), ds(dsum);
  const kf::TensorView dwv = view(dw);
  const kf::TensorView* dwp = w.present ? &dwv : nullptr;
  if (cuda) {
    c10::cuda::CUDAGuard guard(s.device());
    size_t bytes = 0;
    check(kf::add_rms_norm_backward(view(dy), ds.get(), view(s), w.get(), float(eps), view(dx), dwp, nullptr, &bytes,
                                    nullptr));
    Tensor ws = workspace(s, bytes);
    check(kf::add_rms_norm_backward(view(dy), ds.get(), view(s), w.get(), float(eps), view(dx), dwp, ws.data_ptr(),
                                    &bytes, stream_of(s)));
  } else {
    check(kf::ref::add_rms_norm_backward(view(dy), ds.get(), view(s), w.get(), float(eps), view(dx), dwp));
  }
  return {dx, dw};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in,
                                                            const OptTensor& weight, const OptTensor& bias,
                                                            double eps) {
  if (cuda && needs_fallback("layer_norm_backward", x_in)) {
    auto out = layer_norm_backward_impl(false, dy_in.cpu(), x_in.cpu(), to_cpu(weight), to_cpu(bias), eps);
    const auto dev = x_in.device();
    return {std::get<0>(out).to(dev), std::get<1>(out).to(dev), std::get<2>(out).to(dev)};
  }
  const Tensor x = rows(x_in), dy = rows(dy_in);
  Tensor dx = empty_like_rows(x), dw = empty_param(weight, x), db = empty_param(bias, x);
  OptView w(weight), b(bias);
  const kf::TensorView dwv = view(dw), dbv = view(db);
  const kf::TensorView* dwp = w.present ? &dwv : nullptr;
  const kf::TensorView* dbp = b.present ? &dbv : nullptr;
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    size_t bytes = 0;
    check(kf::layer_norm_backward(view(dy), view(x), w.get(), b.get(), float(eps), view(dx), dwp, dbp, nullptr, &bytes,
                                  nullptr));
    Tensor ws = workspace(x, bytes);
    check(kf::layer_norm_backward(view(dy), view(x), w.get(), b.get(), float(eps), view(dx), dwp, dbp, ws.data_ptr(),
                                  &bytes, stream_of(x)));
  } else {
    check(kf::ref::layer_norm_backward(view(dy), view(x), w.get(), b.get(), float(eps), view(dx), dwp, dbp));
  }
  return {dx, dw, db};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> ada_norm_backward_impl(bool cuda, const Tensor& dy_in,
                                                                          const Tensor& x_in, const Tensor& scale,
                                                                          const Tensor& shift, const OptTensor& weight,
                                                                          const OptTensor& bias, double eps,
                                                                          int64_t kind) {
  const kf::NormKind k = norm_kind(kind);
  if (cuda && needs_fallback("ada_norm_backward", x_in)) {
    auto out = ada_norm_backward_impl(false, dy_in.cpu(), x_in.cpu(), scale.cpu(), shift.cpu(), to_cpu(weight),
                                      to_cpu(bias), eps, kind);
    const auto dev = x_in.device();
    return {std::get<0>(out).to(dev), std::get<1>(out).to(dev), std::get<2>(out).to(dev), std::get<3>(out).to(dev),
            std::get<4>(out).to(dev)};
  }
  const Tensor x = rows(x_in), dy = rows(dy_in);
  Tensor dx = empty_like_rows(x), dw = empty_param(weight, x), db = empty_param(bias, x);
  Tensor dsc = at::empty(scale.sizes(), scale.options()), dsh = at::empty(shift.sizes(), shift.options());
  OptView w(weight), b(bias);
  const kf::TensorView dwv = view(dw), dbv = view(db), dscv = view(dsc), dshv = view(dsh);
  const kf::TensorView* dwp = w.present ? &dwv : nullptr;
  const kf::TensorView* dbp = b.present ? &dbv : nullptr;
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    size_t bytes = 0;
    check(kf::ada_norm_backward(view(dy), view(x), view(scale), view(shift), w.get(), b.get(), float(eps), k, view(dx),
                                &dscv, &dshv, dwp, dbp, nullptr, &bytes, nullptr));
    Tensor ws = workspace(x, bytes);
    check(kf::ada_norm_backward(view(dy), view(x), view(scale), view(shift), w.get(), b.get(), float(eps), k, view(dx),
                                &dscv, &dshv, dwp, dbp, ws.data_ptr(), &bytes, stream_of(x)));
  } else {
    check(kf::ref::ada_norm_backward(view(dy), view(x), view(scale), view(shift), w.get(), b.get(), float(eps), k,
                                     view(dx), &dscv, &dshv, dwp, dbp));
  }
  return {dx, dsc, dsh, dw, db};
}

// ---- activation impls (cuda = kernels, else the reference) -----------------------------------
kf::GeluApprox gelu_approx(const char* op, c10::string_view approximate) {
  if (approximate == "none") return kf::GeluApprox::kNone;
  if (approximate == "tanh") return kf::GeluApprox::kTanh;
  TORCH_CHECK(false, op, ": approximate must be 'none' or 'tanh', got '", std::string(approximate), "'");
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

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Tensor grad_or_empty(bool want, const Tensor& g) { return want && g.numel() > 0 ? g : Tensor(); }

class RmsNormFn : public torch::autograd::Function<RmsNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const OptTensor& weight, double eps) {
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x, weight.value_or(Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const OptTensor&, double)>("kernelforge::rms_norm");
    return op.call(x, weight, eps);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("rms_norm");
    auto saved = ctx->get_saved_variables();
    const OptTensor w = saved[1].defined() ? OptTensor(saved[1]) : std::nullopt;
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, double)>(
        "kernelforge::rms_norm_backward");
    auto [dx, dw] = op.call(dense(grads[0]), saved[0], w, ctx->saved_data["eps"].toDouble());
    return {dx, grad_or_empty(w.has_value(), dw), Tensor()};
  }
};

class AddRmsNormFn : public torch::autograd::Function<AddRmsNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& residual, const OptTensor& weight,
                               double eps) {
    ctx->saved_data["eps"] = eps;
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&, double)>(
        "kernelforge::add_rms_norm");
    auto [y, s] = op.call(x, residual, weight, eps);
    ctx->save_for_backward({s, weight.value_or(Tensor())});
    return {y, s};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("add_rms_norm");
    auto saved = ctx->get_saved_variables();
    const OptTensor w = saved[1].defined() ? OptTensor(saved[1]) : std::nullopt;
    static auto op =
        op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&, const OptTensor&, double)>(
            "kernelforge::add_rms_norm_backward");
    auto [dx, dw] = op.call(dense(grads[0]), dense(grads[1]), saved[0], w, ctx->saved_data["eps"].toDouble());
    return {dx, dx, grad_or_empty(w.has_value(), dw), Tensor()};
  }
};

class LayerNormFn : public torch::autograd::Function<LayerNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const OptTensor& weight, const OptTensor& bias,
                        double eps) {
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({x, weight.value_or(Tensor()), bias.value_or(Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op =
        op_handle<Tensor(const Tensor&, const OptTensor&, const OptTensor&, double)>("kernelforge::layer_norm");
    return op.call(x, weight, bias, eps);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("layer_norm");
    auto saved = ctx->get_saved_variables();
    const OptTensor w = saved[1].defined() ? OptTensor(saved[1]) : std::nullopt;
    const OptTensor b = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, double)>("kernelforge::layer_norm_backward");
    auto [dx, dw, db] = op.call(dense(grads[0]), saved[0], w, b, ctx->saved_data["eps"].toDouble());
    return {dx, grad_or_empty(w.has_value(), dw), grad_or_empty(b.has_value(), db), Tensor()};
  }
};

class AdaNormFn : public torch::autograd::Function<AdaNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& scale, const Tensor& shift,
                        const OptTensor& weight, const OptTensor& bias, double eps, int64_t kind) {
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["kind"] = kind;
    ctx->save_for_backward({x, scale, shift, weight.value_or(Tensor()), bias.value_or(Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                                      double, int64_t)>("kernelforge::ada_norm");
    return op.call(x, scale, shift, weight, bias, eps, kind);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("ada_norm");
    auto saved = ctx->get_saved_variables();
    const OptTensor w = saved[3].defined() ? OptTensor(saved[3]) : std::nullopt;
    const OptTensor b = saved[4].defined() ? OptTensor(saved[4]) : std::nullopt;
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, double,
        int64_t)>("kernelforge::ada_norm_backward");
    auto [dx, dsc, dsh, dw, db] = op.call(dense(grads[0]), saved[0], saved[1], saved[2], w, b,
                                          ctx->saved_data["eps"].toDouble(), ctx->saved_data["kind"].toInt());
    return {dx, dsc, dsh, grad_or_empty(w.has_value(), dw), grad_or_empty(b.has_value(), db), Tensor(), Tensor()};
  }
};

// Activation autograd: the forward saves its inputs, the backward recomputes act(a) from them (no
// extra activation tensor is kept), one fused kernel per direction.
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

// ---- RoPE (include/kernelforge/rope.h; schemas in notes/interfaces.md) ------------------------
// layout: 0 = bshd, 1 = bhsd; rotary_dim 0 = cos.size(-1). k is optional: the second output is then an
// empty [0] tensor. cos/sin get no gradient (the autograd function refuses ones that require it).
kf::RopeOptions rope_options(bool interleaved, int64_t layout, int64_t rotary_dim) {
  TORCH_CHECK(layout == 0 || layout == 1, "apply_rope: layout must be 0 (bshd) or 1 (bhsd), got ", layout);
  kf::RopeOptions o;
  o.layout = layout == 0 ? kf::RopeLayout::kBSHD : kf::RopeLayout::kBHSD;
  o.interleaved = interleaved;
  o.rotary_dim = rotary_dim;
  return o;
}

bool defined(const OptTensor& t) { return t.has_value() && t->defined(); }

void rope_run(bool cuda, bool backward, const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
              const OptTensor& pos, const kf::RopeOptions& o, const Tensor& q_out, const OptTensor& k_out) {
  const OptView kv(k), kov(k_out), pv(pos);
  if (cuda) {
    c10::cuda::CUDAGuard guard(q.device());
    check(backward ? kf::apply_rope_backward(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out),
                                             kov.get(), stream_of(q))
                   : kf::apply_rope(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out), kov.get(),
                                    stream_of(q)));
  } else {
    check(backward ? kf::ref::apply_rope_backward(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out),
                                                  kov.get())
                   : kf::ref::apply_rope(view(q), kv.get(), view(cos), view(sin), pv.get(), o, view(q_out), kov.get()));
  }
}

std::tuple<Tensor, Tensor> apply_rope_impl(bool cuda, bool backward, const Tensor& q, const OptTensor& k,
                                           const Tensor& cos, const Tensor& sin, const OptTensor& pos, bool interleaved,
                                           int64_t layout, int64_t rotary_dim) {
  const kf::RopeOptions o = rope_options(interleaved, layout, rotary_dim);
  if (cuda && needs_fallback(backward ? "apply_rope_backward" : "apply_rope", q)) {
    auto out = apply_rope_impl(false, backward, q.cpu(), to_cpu(k), cos.cpu(), sin.cpu(), to_cpu(pos), interleaved,
                               layout, rotary_dim);
    return {std::get<0>(out).to(q.device()), std::get<1>(out).to(q.device())};
  }
  // Outputs keep their input's strides when it is dense (at::empty_like): HF hands over q as a
  // [B, H, S, D] view of [B, S, H, D] memory, and its own q * cos + ... keeps that layout too, so the
  // writes stay contiguous per token and the gradients match the leaf's strides (AccumulateGrad
  // would otherwise copy them). The fake impls (rope.py) follow the same rule.
  Tensor q_out = at::empty_like(q);
  const OptTensor k_out = defined(k) ? OptTensor(at::empty_like(*k)) : std::nullopt;
  rope_run(cuda, backward, q, k, cos, sin, pos, o, q_out, k_out);
  return {q_out, defined(k_out) ? *k_out : at::empty({0}, q.options())};
}

void apply_rope_inplace_impl(bool cuda, const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                             const OptTensor& pos, bool interleaved, int64_t layout, int64_t rotary_dim) {
  const kf::RopeOptions o = rope_options(interleaved, layout, rotary_dim);
  if (cuda && needs_fallback("apply_rope_inplace", q)) {
    auto out = apply_rope_impl(false, false, q.cpu(), to_cpu(k), cos.cpu(), sin.cpu(), to_cpu(pos), interleaved, layout,
                               rotary_dim);
    q.copy_(std::get<0>(out));
    if (defined(k)) k->copy_(std::get<1>(out));
    return;
  }
  rope_run(cuda, false, q, k, cos, sin, pos, o, q, k);
}

class RopeFn : public torch::autograd::Function<RopeFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const OptTensor& k, const Tensor& cos,
                               const Tensor& sin, const OptTensor& pos, bool interleaved, int64_t layout,
                               int64_t rotary_dim) {
    TORCH_CHECK(!cos.requires_grad() && !sin.requires_grad(),
                "apply_rope: gradients with respect to cos and sin are not implemented; pass them detached");
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["layout"] = layout;
    ctx->saved_data["rotary_dim"] = rotary_dim;
    ctx->saved_data["has_k"] = defined(k);
    ctx->save_for_backward({cos, sin, pos.value_or(Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op =
        op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&, const Tensor&,
                                             const OptTensor&, bool, int64_t, int64_t)>("kernelforge::apply_rope");
    auto [qo, ko] = op.call(q, k, cos, sin, pos, interleaved, layout, rotary_dim);
    if (!defined(k)) ctx->mark_non_differentiable({ko});
    return {qo, ko};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("apply_rope");
    auto saved = ctx->get_saved_variables();
    const OptTensor pos = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    const bool has_k = ctx->saved_data["has_k"].toBool();
    // an unused output has no gradient: zeros of its shape (the outputs are contiguous)
    const Tensor dq_out = grads[0].defined() ? dense(grads[0]) : Tensor();
    const Tensor dk_out = has_k && grads[1].defined() ? dense(grads[1]) : Tensor();
    if (!dq_out.defined() && !dk_out.defined()) return variable_list(8);
    static auto op = op_handle<std::tuple<Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&, const Tensor&,
                                                          const OptTensor&, bool, int64_t, int64_t)>(
        "kernelforge::apply_rope_backward");
    const bool interleaved = ctx->saved_data["interleaved"].toBool();
    const int64_t layout = ctx->saved_data["layout"].toInt(), rotary_dim = ctx->saved_data["rotary_dim"].toInt();
    variable_list out(8);
    if (dq_out.defined() && (dk_out.defined() || !has_k)) {
      auto [dq, dk] = op.call(dq_out, has_k ? OptTensor(dk_out) : std::nullopt, saved[0], saved[1], pos, interleaved,
                              layout, rotary_dim);
      out[0] = dq;
      if (has_k) out[1] = dk;
    } else if (dq_out.defined()) {  // k given but its output unused
      out[0] = std::get<0>(op.call(dq_out, std::nullopt, saved[0], saved[1], pos, interleaved, layout, rotary_dim));
    } else {  // only k's output used: run k as the "q" of the call
      out[1] = std::get<0>(op.call(dk_out, std::nullopt, saved[0], saved[1], pos, interleaved, layout, rotary_dim));
    }
    return out;
  }
};

std::tuple<Tensor, Tensor> apply_rope_autograd(const Tensor& q, const OptTensor& k, const Tensor& cos,
                                               const Tensor& sin, const OptTensor& pos, bool interleaved,
                                               int64_t layout, int64_t rotary_dim) {
  auto out = RopeFn::apply(q, k, cos, sin, pos, interleaved, layout, rotary_dim);
  return {out[0], out[1]};
}

// ---- registration -----------------------------------------------------------------------------
template <bool kCuda>
struct Impl {
  static Tensor rms_norm(const Tensor& x, const OptTensor& w, double eps) { return rms_norm_impl(kCuda, x, w, eps); }
  static std::tuple<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& r, const OptTensor& w, double eps) {
    return add_rms_norm_impl(kCuda, x, r, w, eps);
  }
  static Tensor layer_norm(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
    return layer_norm_impl(kCuda, x, w, b, eps);
  }
  static Tensor ada_norm(const Tensor& x, const Tensor& sc, const Tensor& sh, const OptTensor& w, const OptTensor& b,
                         double eps, int64_t kind) {
    return ada_norm_impl(kCuda, x, sc, sh, w, b, eps, kind);
  }
  static std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                      double eps) {
    return rms_norm_backward_impl(kCuda, dy, x, w, eps);
  }
  static std::tuple<Tensor, Tensor> add_rms_norm_backward(const Tensor& dy, const OptTensor& ds, const Tensor& s,
                                                          const OptTensor& w, double eps) {
    return add_rms_norm_backward_impl(kCuda, dy, ds, s, w, eps);
  }
  static std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                                const OptTensor& b, double eps) {
    return layer_norm_backward_impl(kCuda, dy, x, w, b, eps);
  }
  static std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> ada_norm_backward(const Tensor& dy, const Tensor& x,
                                                                              const Tensor& sc, const Tensor& sh,
                                                                              const OptTensor& w, const OptTensor& b,
                                                                              double eps, int64_t kind) {
    return ada_norm_backward_impl(kCuda, dy, x, sc, sh, w, b, eps, kind);
  }
  static Tensor silu_and_mul(const Tensor& x) { return silu_and_mul_impl(kCuda, x); }
  static Tensor swiglu(const Tensor& g, const Tensor& u) { return swiglu_impl(kCuda, g, u); }
  static Tensor gelu_and_mul(const Tensor& x, c10::string_view a, bool gate_first) {
    return gelu_and_mul_impl(kCuda, x, a, gate_first);
  }
  static Tensor geglu(const Tensor& h, const Tensor& g, c10::string_view a) { return geglu_impl(kCuda, h, g, a); }
  static Tensor gelu(const Tensor& x, c10::string_view a) { return gelu_impl(kCuda, x, a); }
  static Tensor silu_and_mul_backward(const Tensor& dy, const Tensor& x) {
    return silu_and_mul_backward_impl(kCuda, dy, x);
  }
  static std::tuple<Tensor, Tensor> swiglu_backward(const Tensor& dy, const Tensor& g, const Tensor& u) {
    return swiglu_backward_impl(kCuda, dy, g, u);
  }
  static Tensor gelu_and_mul_backward(const Tensor& dy, const Tensor& x, c10::string_view a, bool gate_first) {
    return gelu_and_mul_backward_impl(kCuda, dy, x, a, gate_first);
  }
  static std::tuple<Tensor, Tensor> geglu_backward(const Tensor& dy, const Tensor& h, const Tensor& g,
                                                   c10::string_view a) {
    return geglu_backward_impl(kCuda, dy, h, g, a);
  }
  static Tensor gelu_backward(const Tensor& dy, const Tensor& x, c10::string_view a) {
    return gelu_backward_impl(kCuda, dy, x, a);
  }
};

Tensor rms_norm_autograd(const Tensor& x, const OptTensor& w, double eps) { return RmsNormFn::apply(x, w, eps); }
std::tuple<Tensor, Tensor> add_rms_norm_autograd(const Tensor& x, const Tensor& r, const OptTensor& w, double eps) {
  auto out = AddRmsNormFn::apply(x, r, w, eps);
  return {out[0], out[1]};
}
Tensor layer_norm_autograd(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
  return LayerNormFn::apply(x, w, b, eps);
}
Tensor ada_norm_autograd(const Tensor& x, const Tensor& sc, const Tensor& sh, const OptTensor& w, const OptTensor& b,
                         double eps, int64_t kind) {
  return AdaNormFn::apply(x, sc, sh, w, b, eps, kind);
}
Tensor silu_and_mul_autograd(const Tensor& x) { return SiluAndMulFn::apply(x); }
Tensor swiglu_autograd(const Tensor& g, const Tensor& u) { return SwigluFn::apply(g, u); }
Tensor gelu_and_mul_autograd(const Tensor& x, c10::string_view a, bool gate_first) {
  return GeluAndMulFn::apply(x, a, gate_first);
}
Tensor geglu_autograd(const Tensor& h, const Tensor& g, c10::string_view a) { return GegluFn::apply(h, g, a); }
Tensor gelu_autograd(const Tensor& x, c10::string_view a) { return GeluFn::apply(x, a); }

template <bool kCuda>
void register_impls(torch::Library& m) {
  m.impl("rms_norm", &Impl<kCuda>::rms_norm);
  m.impl("add_rms_norm", &Impl<kCuda>::add_rms_norm);
  m.impl("layer_norm", &Impl<kCuda>::layer_norm);
  m.impl("ada_norm", &Impl<kCuda>::ada_norm);
  m.impl("rms_norm_backward", &Impl<kCuda>::rms_norm_backward);
  m.impl("add_rms_norm_backward", &Impl<kCuda>::add_rms_norm_backward);
  m.impl("layer_norm_backward", &Impl<kCuda>::layer_norm_backward);
  m.impl("ada_norm_backward", &Impl<kCuda>::ada_norm_backward);
  m.impl("silu_and_mul", &Impl<kCuda>::silu_and_mul);
  m.impl("swiglu", &Impl<kCuda>::swiglu);
  m.impl("gelu_and_mul", &Impl<kCuda>::gelu_and_mul);
  m.impl("geglu", &Impl<kCuda>::geglu);
  m.impl("gelu", &Impl<kCuda>::gelu);
  m.impl("silu_and_mul_backward", &Impl<kCuda>::silu_and_mul_backward);
  m.impl("swiglu_backward", &Impl<kCuda>::swiglu_backward);
  m.impl("gelu_and_mul_backward", &Impl<kCuda>::gelu_and_mul_backward);
  m.impl("geglu_backward", &Impl<kCuda>::geglu_backward);
  m.impl("gelu_backward", &Impl<kCuda>::gelu_backward);
  m.impl("apply_rope", [](const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                          const OptTensor& pos, bool interleaved, int64_t layout, int64_t rotary_dim) {
    return apply_rope_impl(kCuda, false, q, k, cos, sin, pos, interleaved, layout, rotary_dim);
  });
  m.impl("apply_rope_backward", [](const Tensor& dq_out, const OptTensor& dk_out, const Tensor& cos, const Tensor& sin,
                                   const OptTensor& pos, bool interleaved, int64_t layout, int64_t rotary_dim) {
    return apply_rope_impl(kCuda, true, dq_out, dk_out, cos, sin, pos, interleaved, layout, rotary_dim);
  });
  m.impl("apply_rope_inplace", [](const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                                  const OptTensor& pos, bool interleaved, int64_t layout, int64_t rotary_dim) {
    apply_rope_inplace_impl(kCuda, q, k, cos, sin, pos, interleaved, layout, rotary_dim);
  });
}

}  // namespace

TORCH_LIBRARY(kernelforge, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor", tags);
  m.def("rms_norm_backward(Tensor dy, Tensor x, Tensor? weight, float eps) -> (Tensor, Tensor)", tags);
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)", tags);
  m.def("add_rms_norm_backward(Tensor dy, Tensor? dsum, Tensor sum, Tensor? weight, float eps) -> (Tensor, Tensor)",
        tags);
  m.def("layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor", tags);
  m.def("layer_norm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
        tags);
  m.def("ada_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight, Tensor? bias, float eps, int kind) -> Tensor",
        tags);
  m.def(
      "ada_norm_backward(Tensor dy, Tensor x, Tensor scale, Tensor shift, Tensor? weight, Tensor? bias, float eps, "
      "int kind) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      tags);
  // activations (schemas: notes/interfaces.md); approximate is F.gelu's: 'none' (erf) or 'tanh'
  m.def("silu_and_mul(Tensor x) -> Tensor", tags);
  m.def("silu_and_mul_backward(Tensor dy, Tensor x) -> Tensor", tags);
  m.def("swiglu(Tensor gate, Tensor up) -> Tensor", tags);
  m.def("swiglu_backward(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)", tags);
  m.def("gelu_and_mul(Tensor x, str approximate=\"tanh\", bool gate_first=True) -> Tensor", tags);
  m.def("gelu_and_mul_backward(Tensor dy, Tensor x, str approximate, bool gate_first) -> Tensor", tags);
  m.def("geglu(Tensor hidden, Tensor gate, str approximate=\"none\") -> Tensor", tags);
  m.def("geglu_backward(Tensor dy, Tensor hidden, Tensor gate, str approximate) -> (Tensor, Tensor)", tags);
  m.def("gelu(Tensor x, str approximate=\"none\") -> Tensor", tags);
  m.def("gelu_backward(Tensor dy, Tensor x, str approximate) -> Tensor", tags);
  // rope: layout 0 = bshd, 1 = bhsd; rotary_dim 0 = cos.size(-1); returns (q_out, k_out), k_out empty [0]
  // without k; apply_rope_inplace rotates q and k in place (no autograd)
  m.def(
      "apply_rope(Tensor q, Tensor? k, Tensor cos, Tensor sin, Tensor? position_ids, bool interleaved, int layout, "
      "int rotary_dim) -> (Tensor, Tensor)",
      tags);
  m.def(
      "apply_rope_backward(Tensor dq_out, Tensor? dk_out, Tensor cos, Tensor sin, Tensor? position_ids, "
      "bool interleaved, int layout, int rotary_dim) -> (Tensor, Tensor)",
      tags);
  m.def(
      "apply_rope_inplace(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, Tensor? position_ids, "
      "bool interleaved, int layout, int rotary_dim) -> ()",
      tags);
}

TORCH_LIBRARY_IMPL(kernelforge, CUDA, m) { register_impls<true>(m); }
TORCH_LIBRARY_IMPL(kernelforge, CPU, m) { register_impls<false>(m); }
TORCH_LIBRARY_IMPL(kernelforge, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("ada_norm", &ada_norm_autograd);
  m.impl("silu_and_mul", &silu_and_mul_autograd);
  m.impl("swiglu", &swiglu_autograd);
  m.impl("gelu_and_mul", &gelu_and_mul_autograd);
  m.impl("geglu", &geglu_autograd);
  m.impl("gelu", &gelu_autograd);
  m.impl("apply_rope", &apply_rope_autograd);
}
