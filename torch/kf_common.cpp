// The shared helpers of the binding (kf_common.h) and the library-wide ops. TORCH_LIBRARY opens the
// kernelforge namespace once; every family file adds its ops with TORCH_LIBRARY_FRAGMENT.
#include "kf_common.h"

#include <cstdlib>
#include <cstring>

#include "kernelforge/kernelforge.h"

namespace kftorch {

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

namespace {
bool strict_mode() {
  const char* s = std::getenv("KF_STRICT");
  return s != nullptr && std::strcmp(s, "") != 0 && std::strcmp(s, "0") != 0;
}
}  // namespace

bool needs_fallback(const char* op, const Tensor& x) {
  if (!x.is_cuda() || x.scalar_type() != at::kDouble) return false;
  TORCH_CHECK(!strict_mode(), "kernelforge.", op,
              ": float64 CUDA tensors have no kernel (KF_STRICT=1 forbids the CPU reference fallback)");
  TORCH_WARN_ONCE("kernelforge: float64 CUDA tensors have no kernel; ", op,
                  " runs the float64 CPU reference instead (slow, synchronizes). Set KF_STRICT=1 to make this an "
                  "error.");
  return true;
}

void no_double_backward(const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              ": double backward (create_graph=True) is not implemented; compute second derivatives "
              "with the PyTorch reference instead (kernelforge.unpatch, or the eager module)");
}

std::string op_name(const char* schema) {
  const char* paren = std::strchr(schema, '(');
  return paren ? std::string(schema, paren) : std::string(schema);
}

namespace {
// The plan of the last kernelforge launch on the calling thread ("" before the first). Autograd runs
// CUDA backward passes on its own threads, so after loss.backward() this is the last forward's plan.
std::string last_plan() { return kf::last_plan(); }
}  // namespace

}  // namespace kftorch

TORCH_LIBRARY(kernelforge, m) { m.def("last_plan() -> str", &kftorch::last_plan); }
