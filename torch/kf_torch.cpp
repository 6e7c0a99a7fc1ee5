// The PyTorch binding: the only file that includes torch headers. It registers the kernelforge::*
// ops (schemas, CUDA impl = our kernels, CPU impl = the float64 C++ reference, Autograd = C++
// autograd functions, so a call has no Python frame below the functional wrapper). Fake impls are
// registered in Python (python/kernelforge/_ops.py). Every check lives in the C++ core; this file
// only converts tensors to views, allocates outputs with PyTorch's allocator and picks the stream.
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

#include "kernelforge/norm.h"

namespace kf = kernelforge;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

namespace {

kf::DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kf::DType::kFloat32;
    case at::kHalf:
      return kf::DType::kFloat16;
    case at::kBFloat16:
      return kf::DType::kBFloat16;
    case at::kDouble:
      return kf::DType::kFloat64;
    case at::kInt:
      return kf::DType::kInt32;
    case at::kLong:
      return kf::DType::kInt64;
    default:
      return kf::DType::kOther;
  }
}

kf::TensorView view(const Tensor& t) {
  kf::TensorView v;
  TORCH_CHECK(t.dim() <= kf::kMaxDims, "kernelforge: tensors may have at most ", kf::kMaxDims, " dimensions, got ",
              t.dim());
  v.data = t.numel() > 0 ? const_cast<void*>(t.data_ptr()) : nullptr;
  v.dtype = to_dtype(t.scalar_type());
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  v.device.type = t.is_cuda() ? kf::DeviceType::kCUDA : kf::DeviceType::kCPU;
  v.device.index = t.is_cuda() ? t.get_device() : 0;
  return v;
}

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

void check(const kf::Status& s) { TORCH_CHECK(s.ok(), s.message()); }

// Leading dims that do not collapse into one row stride are copied (the kernels take one row
// stride); a non-contiguous last dimension is left for the core to reject with a clear message.
Tensor rows(const Tensor& t) {
  if (t.dim() <= 2 || (t.size(-1) > 1 && t.stride(-1) != 1)) return t;
  int64_t expect = -1;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expect >= 0 && t.stride(d) != expect) return t.contiguous();
    expect = t.stride(d) * t.size(d);
  }
  return t;
}

Tensor empty_like_rows(const Tensor& x) { return at::empty(x.sizes(), x.options()); }
Tensor empty_param(const OptTensor& p, const Tensor& x) {
  return p.has_value() && p->defined() ? at::empty(p->sizes(), p->options()) : at::empty({0}, x.options());
}

cudaStream_t stream_of(const Tensor& x) { return at::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

// float64 (or anything else our kernels cannot take) on CUDA: run the reference on the CPU, once
// warned; KF_STRICT=1 turns it into an error. Never silent.
bool strict_mode() {
  const char* s = std::getenv("KF_STRICT");
  return s != nullptr && std::strcmp(s, "") != 0 && std::strcmp(s, "0") != 0;
}
bool needs_fallback(const char* op, const Tensor& x) {
  if (!x.is_cuda() || x.scalar_type() != at::kDouble) return false;
  TORCH_CHECK(!strict_mode(), "kernelforge.", op,
              ": float64 CUDA tensors have no kernel (KF_STRICT=1 forbids the CPU reference fallback)");
  TORCH_WARN_ONCE("kernelforge: float64 CUDA tensors have no kernel; ", op,
                  " runs the float64 CPU reference instead (slow, synchronizes). Set KF_STRICT=1 to make this an "
                  "error.");
  return true;
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

// ---- dispatcher handles (backward ops are called through the dispatcher so that torch.compile
// and other tracers see them) -----------------------------------------------------------------
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Tensor grad_or_empty(bool want, const Tensor& g) { return want && g.numel() > 0 ? g : Tensor(); }

// Autograd may hand an expanded gradient (e.g. of y.sum(): stride 0); the kernels need a
// contiguous last dimension.
Tensor dense(const Tensor& g) { return g.dim() > 0 && g.size(-1) > 1 && g.stride(-1) != 1 ? g.contiguous() : g; }

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
}

TORCH_LIBRARY_IMPL(kernelforge, CUDA, m) { register_impls<true>(m); }
TORCH_LIBRARY_IMPL(kernelforge, CPU, m) { register_impls<false>(m); }
TORCH_LIBRARY_IMPL(kernelforge, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("ada_norm", &ada_norm_autograd);
}
