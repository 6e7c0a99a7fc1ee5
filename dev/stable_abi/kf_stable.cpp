// A probe, not part of the library: kernelforge's rms_norm bound through torch's stable ABI
// (torch/csrc/stable: boxed kernels over StableIValue, only the C shim of libtorch), to measure what
// a `kernels`-hub "torch-stable-abi" build would cost on the per-call host path against the regular
// binding (torch/kf_norm.cpp: an unboxed C++ kernel with a C++ autograd kernel). The stable ABI has
// no autograd registration, so probe.py registers the backward from Python, as such a build would.
#include <kernelforge/norm.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <string>

namespace kf = kernelforge;

using torch::stable::Tensor;

static kf::TensorView view(const Tensor& t) {
  kf::TensorView v;
  STD_TORCH_CHECK(t.dim() <= kf::kMaxDims, "kf_stable: too many dimensions");
  v.data = t.numel() > 0 ? t.data_ptr() : nullptr;
  switch (t.scalar_type()) {
    case torch::headeronly::ScalarType::BFloat16:
      v.dtype = kf::DType::kBFloat16;
      break;
    case torch::headeronly::ScalarType::Half:
      v.dtype = kf::DType::kFloat16;
      break;
    case torch::headeronly::ScalarType::Float:
      v.dtype = kf::DType::kFloat32;
      break;
    default:
      STD_TORCH_CHECK(false, "kf_stable: float32, float16 or bfloat16 expected");
  }
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  v.device.type = kf::DeviceType::kCUDA;
  v.device.index = t.get_device_index();
  return v;
}

static cudaStream_t stream_of(const Tensor& t) {
  void* s = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &s));
  return static_cast<cudaStream_t>(s);
}

static void check(const kf::Status& s) { STD_TORCH_CHECK(s.ok(), std::string(s.message())); }

Tensor rms_norm(Tensor x, Tensor w, double eps) {
  Tensor y = torch::stable::empty_like(x);
  const kf::TensorView wv = view(w);
  check(kf::rms_norm(view(x), &wv, float(eps), view(y), stream_of(x)));
  return y;
}

STABLE_TORCH_LIBRARY(kf_stable, m) { m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor"); }

STABLE_TORCH_LIBRARY_IMPL(kf_stable, CUDA, m) { m.impl("rms_norm", TORCH_BOX(&rms_norm)); }
