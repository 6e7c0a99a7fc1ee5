// Helpers shared by the binding files of the kernelforge torch extension (kf_torch.cpp: norm,
// activation, rope; kf_softmax.cpp: softmax): tensor -> view conversion, Status -> exception, the row
// layout fix-up, the stream, the float64-on-CUDA fallback policy and the autograd helpers. Inline
// functions in a named namespace: one definition (and one TORCH_WARN_ONCE flag) per process.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kf_torch {

inline kernelforge::DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kernelforge::DType::kFloat32;
    case at::kHalf:
      return kernelforge::DType::kFloat16;
    case at::kBFloat16:
      return kernelforge::DType::kBFloat16;
    case at::kDouble:
      return kernelforge::DType::kFloat64;
    case at::kInt:
      return kernelforge::DType::kInt32;
    case at::kLong:
      return kernelforge::DType::kInt64;
    default:
      return kernelforge::DType::kOther;
  }
}

inline kernelforge::TensorView view(const at::Tensor& t) {
  kernelforge::TensorView v;
  TORCH_CHECK(t.dim() <= kernelforge::kMaxDims, "kernelforge: tensors may have at most ", kernelforge::kMaxDims,
              " dimensions, got ", t.dim());
  v.data = t.numel() > 0 ? const_cast<void*>(t.data_ptr()) : nullptr;
  v.dtype = to_dtype(t.scalar_type());
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  v.device.type = t.is_cuda() ? kernelforge::DeviceType::kCUDA : kernelforge::DeviceType::kCPU;
  v.device.index = t.is_cuda() ? t.get_device() : 0;
  return v;
}

inline void check(const kernelforge::Status& s) { TORCH_CHECK(s.ok(), s.message()); }

// Leading dims that do not collapse into one row stride are copied (the kernels take one row
// stride); a non-contiguous last dimension is left for the core to reject with a clear message.
inline at::Tensor rows(const at::Tensor& t) {
  if (t.dim() <= 2 || (t.size(-1) > 1 && t.stride(-1) != 1)) return t;
  int64_t expect = -1;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expect >= 0 && t.stride(d) != expect) return t.contiguous();
    expect = t.stride(d) * t.size(d);
  }
  return t;
}

inline cudaStream_t stream_of(const at::Tensor& x) { return at::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

// float64 (or anything else our kernels cannot take) on CUDA: run the reference on the CPU, once
// warned; KF_STRICT=1 turns it into an error. Never silent.
inline bool strict_mode() {
  const char* s = std::getenv("KF_STRICT");
  return s != nullptr && std::strcmp(s, "") != 0 && std::strcmp(s, "0") != 0;
}
inline bool needs_fallback(const char* op, const at::Tensor& x) {
  if (!x.is_cuda() || x.scalar_type() != at::kDouble) return false;
  TORCH_CHECK(!strict_mode(), "kernelforge.", op,
              ": float64 CUDA tensors have no kernel (KF_STRICT=1 forbids the CPU reference fallback)");
  TORCH_WARN_ONCE("kernelforge: float64 CUDA tensors have no kernel; ", op,
                  " runs the float64 CPU reference instead (slow, synchronizes). Set KF_STRICT=1 to make this an "
                  "error.");
  return true;
}

// ---- dispatcher handles (backward ops are called through the dispatcher so that torch.compile
// and other tracers see them) -----------------------------------------------------------------
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// The backward ops have no autograd of their own: under create_graph=True (double backward, e.g. a
// gradient penalty) their outputs would carry no graph and the second derivatives would silently be
// zero. The engine runs backward with grad mode on exactly then, so that case is an error.
inline void no_double_backward(const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              ": double backward (create_graph=True) is not implemented; compute second derivatives "
              "with the PyTorch reference instead (kernelforge.unpatch, or the eager module)");
}

// Autograd may hand an expanded gradient (e.g. of y.sum(): stride 0); the kernels need a
// contiguous last dimension.
inline at::Tensor dense(const at::Tensor& g) {
  return g.dim() > 0 && g.size(-1) > 1 && g.stride(-1) != 1 ? g.contiguous() : g;
}

}  // namespace kf_torch
