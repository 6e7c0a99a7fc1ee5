// The PyTorch binding of the norm family (include/kernelforge/norm.h): rms_norm, add_rms_norm,
// layer_norm, ada_norm and their backward ops. CUDA = our kernels, CPU = the float64 reference,
// Autograd = the C++ functions below (a call has no Python frame below the functional wrapper).
// Fake impls: python/kernelforge/norm.py. Schemas: the TORCH_LIBRARY_FRAGMENT at the end.
#include <string>
#include <tuple>

#include "kernelforge/norm.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

// ---- forward (cuda = our kernels, otherwise the float64 reference) ----------------------------------
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

constexpr EnumName<kf::NormKind> kNormKinds[] = {{"layer", kf::NormKind::kLayer}, {"rms", kf::NormKind::kRms}};

Tensor ada_norm_impl(bool cuda, const Tensor& x_in, const Tensor& scale, const Tensor& shift, const OptTensor& weight,
                     const OptTensor& bias, double eps, c10::string_view kind) {
  const kf::NormKind k = parse_enum("ada_norm", "kind", kind, kNormKinds);
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
                                                                          c10::string_view kind) {
  const kf::NormKind k = parse_enum("ada_norm_backward", "kind", kind, kNormKinds);
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

// ---- autograd ------------------------------------------------------------------------------------
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
    const OptTensor w = saved_opt(saved[1]);
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
    const OptTensor w = saved_opt(saved[1]);
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
    const OptTensor w = saved_opt(saved[1]);
    const OptTensor b = saved_opt(saved[2]);
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, double)>("kernelforge::layer_norm_backward");
    auto [dx, dw, db] = op.call(dense(grads[0]), saved[0], w, b, ctx->saved_data["eps"].toDouble());
    return {dx, grad_or_empty(w.has_value(), dw), grad_or_empty(b.has_value(), db), Tensor()};
  }
};

class AdaNormFn : public torch::autograd::Function<AdaNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& scale, const Tensor& shift,
                        const OptTensor& weight, const OptTensor& bias, double eps, c10::string_view kind) {
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["kind"] = std::string(kind);
    ctx->save_for_backward({x, scale, shift, weight.value_or(Tensor()), bias.value_or(Tensor())});
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = op_handle<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                                      double, c10::string_view)>("kernelforge::ada_norm");
    return op.call(x, scale, shift, weight, bias, eps, kind);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    no_double_backward("ada_norm");
    auto saved = ctx->get_saved_variables();
    const OptTensor w = saved_opt(saved[3]);
    const OptTensor b = saved_opt(saved[4]);
    static auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, double,
        c10::string_view)>("kernelforge::ada_norm_backward");
    auto [dx, dsc, dsh, dw, db] = op.call(dense(grads[0]), saved[0], saved[1], saved[2], w, b,
                                          ctx->saved_data["eps"].toDouble(), ctx->saved_data["kind"].toStringRef());
    return {dx, dsc, dsh, grad_or_empty(w.has_value(), dw), grad_or_empty(b.has_value(), db), Tensor(), Tensor()};
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
                         double eps, c10::string_view kind) {
  return AdaNormFn::apply(x, sc, sh, w, b, eps, kind);
}

}  // namespace

// kind: "layer" (LayerNorm) or "rms" (RMSNorm). Gradients of absent optional parameters are empty
// [0] tensors.
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&rms_norm_impl, &rms_norm_autograd>(m, "rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor");
  def_op<&rms_norm_backward_impl>(
      m, "rms_norm_backward(Tensor dy, Tensor x, Tensor? weight, float eps) -> (Tensor, Tensor)");
  def_op<&add_rms_norm_impl, &add_rms_norm_autograd>(
      m, "add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)");
  def_op<&add_rms_norm_backward_impl>(
      m, "add_rms_norm_backward(Tensor dy, Tensor? dsum, Tensor sum, Tensor? weight, float eps) -> (Tensor, Tensor)");
  def_op<&layer_norm_impl, &layer_norm_autograd>(
      m, "layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor");
  def_op<&layer_norm_backward_impl>(m,
                                    "layer_norm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, float eps) "
                                    "-> (Tensor, Tensor, Tensor)");
  def_op<&ada_norm_impl, &ada_norm_autograd>(
      m, "ada_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight, Tensor? bias, float eps, str kind) -> Tensor");
  def_op<&ada_norm_backward_impl>(m,
                                  "ada_norm_backward(Tensor dy, Tensor x, Tensor scale, Tensor shift, Tensor? weight, "
                                  "Tensor? bias, float eps, str kind) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}
