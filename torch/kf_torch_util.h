// Helpers shared by the binding files (kf_torch.cpp, kf_cross_entropy.cpp, ...): tensor -> view
// conversion, status checks, row views, streams, the float64 fallback policy, workspaces and the
// autograd conventions. Only binding files include this (it includes torch headers).
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kftorch {

namespace kf = kernelforge;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

inline kf::DType to_dtype(at::ScalarType t) {
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

inline kf::TensorView view(const Tensor& t) {
  kf::TensorView v;
  TORCH_CHECK(t.dim() <= kf::kMaxDims, "kernelforge: tensors may have at most ", std::to_string(kf::kMaxDims),
              " dimensions, got ", std::to_string(t.dim()));
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

inline void check(const kf::Status& s) { TORCH_CHECK(s.ok(), s.message()); }

// Leading dims that do not collapse into one row stride are copied (the kernels take one row
// stride); a non-contiguous last dimension is left for the core to reject with a clear message.
inline Tensor rows(const Tensor& t) {
  if (t.dim() <= 2 || (t.size(-1) > 1 && t.stride(-1) != 1)) return t;
  int64_t expect = -1;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expect >= 0 && t.stride(d) != expect) return t.contiguous();
    expect = t.stride(d) * t.size(d);
  }
  return t;
}

inline Tensor empty_like_rows(const Tensor& x) { return at::empty(x.sizes(), x.options()); }
inline Tensor empty_param(const OptTensor& p, const Tensor& x) {
  return p.has_value() && p->defined() ? at::empty(p->sizes(), p->options()) : at::empty({0}, x.options());
}

inline cudaStream_t stream_of(const Tensor& x) { return at::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

// float64 (or anything else our kernels cannot take) on CUDA: run the reference on the CPU, once
// warned; KF_STRICT=1 turns it into an error. Never silent.
inline bool strict_mode() {
  const char* s = std::getenv("KF_STRICT");
  return s != nullptr && std::strcmp(s, "") != 0 && std::strcmp(s, "0") != 0;
}
inline bool needs_fallback(const char* op, const Tensor& x) {
  if (!x.is_cuda() || x.scalar_type() != at::kDouble) return false;
  TORCH_CHECK(!strict_mode(), "kernelforge.", op,
              ": float64 CUDA tensors have no kernel (KF_STRICT=1 forbids the CPU reference fallback)");
  TORCH_WARN_ONCE("kernelforge: float64 CUDA tensors have no kernel; ", op,
                  " runs the float64 CPU reference instead (slow, synchronizes). Set KF_STRICT=1 to make this an "
                  "error.");
  return true;
}
inline OptTensor to_cpu(const OptTensor& t) { return t.has_value() && t->defined() ? OptTensor(t->cpu()) : t; }

inline Tensor workspace(const Tensor& x, size_t bytes) {
  return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))}, x.options().dtype(at::kByte));
}

// ---- dispatcher handles (backward ops are called through the dispatcher so that torch.compile
// and other tracers see them) -----------------------------------------------------------------
template <typename Sig>
inline c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline Tensor grad_or_empty(bool want, const Tensor& g) { return want && g.numel() > 0 ? g : Tensor(); }

// Autograd may hand an expanded gradient (e.g. of y.sum(): stride 0); the kernels need a
// contiguous last dimension.
// The backward ops have no autograd of their own: under create_graph=True (double backward, e.g. a
// gradient penalty) their outputs would carry no graph and the second derivatives would silently be
// zero. The engine runs backward with grad mode on exactly then, so that case is an error.
inline void no_double_backward(const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              ": double backward (create_graph=True) is not implemented; compute second derivatives "
              "with the PyTorch reference instead (kernelforge.unpatch, or the eager module)");
}

inline Tensor dense(const Tensor& g) { return g.dim() > 0 && g.size(-1) > 1 && g.stride(-1) != 1 ? g.contiguous() : g; }

}  // namespace kftorch
