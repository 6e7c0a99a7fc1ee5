// Public entry points of the softmax family: validate (softmax_validate.cpp), check the device,
// dispatch the dtype once, launch (softmax_kernels.cuh: the launch plan lives there).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device.h"
#include "softmax/softmax_problem.h"

namespace kernelforge {

namespace {

Status check_device(const SoftmaxCall& c, const TensorView& t, DType dtype, SoftmaxParams* p) {
  int dev = 0;
  const DeviceInfo* info = nullptr;
  Status s = current_device_info(&dev, &info);
  if (!s.ok()) return Status(s.code(), std::string(c.name) + ": " + s.message());
  if (t.device.index != dev)
    return Status::Invalid(std::string(c.name) + ": inputs are on cuda:" + std::to_string(t.device.index) +
                           " but the current CUDA device is cuda:" + std::to_string(dev));
  if (dtype == DType::kBFloat16 && info->capability < 80)
    return Status::NotSupported(std::string(c.name) +
                                ": bfloat16 needs a GPU of compute capability 8.0 or newer, "
                                "this one is sm_" +
                                std::to_string(info->capability) + "; use float16 or float32");
  p->capability = info->capability;
  p->sm_count = info->sm_count;
  return Status::Ok();
}

Status run(const SoftmaxCall& c, cudaStream_t stream) {
  SoftmaxParams p;
  DType dtype;
  Status s = validate_softmax(c, &p, &dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c, c.backward ? *c.g : *c.x, dtype, &p)).ok()) return s;
  if (p.rows == 0) return Status::Ok();  // nothing to compute: no launch
  switch (dtype) {
    case DType::kFloat32:
      return launch_softmax<float>(c.log, c.backward, p, stream);
    case DType::kFloat16:
      return launch_softmax<__half>(c.log, c.backward, p, stream);
    case DType::kBFloat16:
      return launch_softmax<__nv_bfloat16>(c.log, c.backward, p, stream);
    default:
      return Status::Invalid(std::string(c.name) + ": unsupported dtype");
  }
}

SoftmaxCall make(const char* name, bool log, bool bwd) {
  SoftmaxCall c;
  c.name = name;
  c.log = log;
  c.backward = bwd;
  c.cuda = true;
  return c;
}

}  // namespace

Status softmax(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  SoftmaxCall c = make("softmax", false, false);
  c.x = &x, c.y = &y;
  return run(c, stream);
}

Status log_softmax(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  SoftmaxCall c = make("log_softmax", true, false);
  c.x = &x, c.y = &y;
  return run(c, stream);
}

Status softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx, cudaStream_t stream) {
  SoftmaxCall c = make("softmax_backward", false, true);
  c.g = &g, c.y = &y, c.dx = &dx;
  return run(c, stream);
}

Status log_softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx, cudaStream_t stream) {
  SoftmaxCall c = make("log_softmax_backward", true, true);
  c.g = &g, c.y = &y, c.dx = &dx;
  return run(c, stream);
}

}  // namespace kernelforge
