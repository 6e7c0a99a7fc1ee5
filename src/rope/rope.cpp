// Public entry points of the RoPE family: validate (rope_validate.cpp), check the device, dispatch
// the dtype once, launch (rope_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device.h"
#include "rope/rope_problem.h"

namespace kernelforge {

namespace {

Status run(const RopeCall& c, cudaStream_t stream) {
  RopeParams p;
  DType dtype, cs_dtype;
  Status s = validate_rope(c, &p, &dtype, &cs_dtype);
  if (!s.ok()) return s;
  int dev = 0;
  const DeviceInfo* info = nullptr;
  if (!(s = current_device_info(&dev, &info)).ok()) return Status(s.code(), std::string(c.name) + ": " + s.message());
  if (c.q->device.index != dev)
    return Status::Invalid(std::string(c.name) + ": inputs are on cuda:" + std::to_string(c.q->device.index) +
                           " but the current CUDA device is cuda:" + std::to_string(dev));
  if ((dtype == DType::kBFloat16 || cs_dtype == DType::kBFloat16) && info->capability < 80)
    return Status::NotSupported(std::string(c.name) +
                                ": bfloat16 needs a GPU of compute capability 8.0 or newer, this one is sm_" +
                                std::to_string(info->capability) + "; use float16 or float32");
  p.capability = info->capability;
  p.sm_count = info->sm_count;
  const bool cs_float = cs_dtype == DType::kFloat32;
  switch (dtype) {
    case DType::kFloat32:
      return launch_rope<float>(p, cs_float, stream);
    case DType::kFloat16:
      return launch_rope<__half>(p, cs_float, stream);
    case DType::kBFloat16:
      return launch_rope<__nv_bfloat16>(p, cs_float, stream);
    default:
      return Status::Invalid(std::string(c.name) + ": unsupported dtype");
  }
}

}  // namespace

Status apply_rope(const TensorView& q, const TensorView* k, const TensorView& cos, const TensorView& sin,
                  const TensorView* position_ids, const RopeOptions& opts, const TensorView& q_out,
                  const TensorView* k_out, cudaStream_t stream) {
  RopeCall c;
  c.name = "apply_rope";
  c.q = &q, c.k = k, c.cos = &cos, c.sin = &sin, c.pos = position_ids, c.opts = opts, c.q_out = &q_out, c.k_out = k_out;
  return run(c, stream);
}

Status apply_rope_backward(const TensorView& dq_out, const TensorView* dk_out, const TensorView& cos,
                           const TensorView& sin, const TensorView* position_ids, const RopeOptions& opts,
                           const TensorView& dq, const TensorView* dk, cudaStream_t stream) {
  RopeCall c;
  c.name = "apply_rope_backward";
  c.backward = true;
  c.q = &dq_out, c.k = dk_out, c.cos = &cos, c.sin = &sin, c.pos = position_ids, c.opts = opts, c.q_out = &dq,
  c.k_out = dk;
  return run(c, stream);
}

}  // namespace kernelforge
