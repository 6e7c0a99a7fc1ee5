// Public entry points of the activation family: validate (activation_validate.cpp), check the
// device, dispatch the dtype once, launch (activation_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "activation/activation_problem.h"
#include "common/device.h"

namespace kernelforge {

namespace {

Status check_device(const ActCall& c, const TensorView& x, DType dtype, ActParams* p) {
  int dev = 0;
  const DeviceInfo* info = nullptr;
  Status s = current_device_info(&dev, &info);
  if (!s.ok()) return Status(s.code(), std::string(c.name) + ": " + s.message());
  if (x.device.index != dev)
    return Status::Invalid(std::string(c.name) + ": inputs are on cuda:" + std::to_string(x.device.index) +
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

// The primary input (the one whose device the call runs on).
const TensorView& primary(const ActCall& c) {
  if (c.op == ActOp::kSwiglu) return *c.gate;
  if (c.op == ActOp::kGeglu) return *c.up;
  return *c.x;
}

Status run(const ActCall& c, cudaStream_t stream) {
  ActParams p;
  DType dtype;
  Status s = validate_activation(c, &p, &dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c, primary(c), dtype, &p)).ok()) return s;
  if (p.rows == 0) return Status::Ok();  // nothing to compute: no launch
  const ActFn fn = act_fn(c.op, c.approx);
  const bool gated = act_is_gated(c.op);
  switch (dtype) {
    case DType::kFloat32:
      return c.backward ? launch_act_bwd<float>(fn, gated, p, stream) : launch_act_fwd<float>(fn, gated, p, stream);
    case DType::kFloat16:
      return c.backward ? launch_act_bwd<__half>(fn, gated, p, stream) : launch_act_fwd<__half>(fn, gated, p, stream);
    case DType::kBFloat16:
      return c.backward ? launch_act_bwd<__nv_bfloat16>(fn, gated, p, stream)
                        : launch_act_fwd<__nv_bfloat16>(fn, gated, p, stream);
    default:
      return Status::Invalid(std::string(c.name) + ": unsupported dtype");
  }
}

ActCall make(const char* name, ActOp op, bool bwd) {
  ActCall c;
  c.name = name;
  c.op = op;
  c.backward = bwd;
  c.cuda = true;
  return c;
}

}  // namespace

Status silu_and_mul(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  ActCall c = make("silu_and_mul", ActOp::kSiluAndMul, false);
  c.x = &x, c.y = &y;
  return run(c, stream);
}

Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& y, cudaStream_t stream) {
  ActCall c = make("swiglu", ActOp::kSwiglu, false);
  c.gate = &gate, c.up = &up, c.y = &y;
  return run(c, stream);
}

Status gelu_and_mul(const TensorView& x, GeluApprox approximate, bool gate_first, const TensorView& y,
                    cudaStream_t stream) {
  ActCall c = make("gelu_and_mul", ActOp::kGeluAndMul, false);
  c.x = &x, c.y = &y, c.approx = approximate, c.gate_first = gate_first;
  return run(c, stream);
}

Status geglu(const TensorView& hidden, const TensorView& gate, GeluApprox approximate, const TensorView& y,
             cudaStream_t stream) {
  ActCall c = make("geglu", ActOp::kGeglu, false);
  c.up = &hidden, c.gate = &gate, c.y = &y, c.approx = approximate;
  return run(c, stream);
}

Status gelu(const TensorView& x, GeluApprox approximate, const TensorView& y, cudaStream_t stream) {
  ActCall c = make("gelu", ActOp::kGelu, false);
  c.x = &x, c.y = &y, c.approx = approximate;
  return run(c, stream);
}

Status silu_and_mul_backward(const TensorView& dy, const TensorView& x, const TensorView& dx, cudaStream_t stream) {
  ActCall c = make("silu_and_mul_backward", ActOp::kSiluAndMul, true);
  c.dy = &dy, c.x = &x, c.dx = &dx;
  return run(c, stream);
}

Status swiglu_backward(const TensorView& dy, const TensorView& gate, const TensorView& up, const TensorView& dgate,
                       const TensorView& dup, cudaStream_t stream) {
  ActCall c = make("swiglu_backward", ActOp::kSwiglu, true);
  c.dy = &dy, c.gate = &gate, c.up = &up, c.dgate = &dgate, c.dup = &dup;
  return run(c, stream);
}

Status gelu_and_mul_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, bool gate_first,
                             const TensorView& dx, cudaStream_t stream) {
  ActCall c = make("gelu_and_mul_backward", ActOp::kGeluAndMul, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate, c.gate_first = gate_first;
  return run(c, stream);
}

Status geglu_backward(const TensorView& dy, const TensorView& hidden, const TensorView& gate, GeluApprox approximate,
                      const TensorView& dhidden, const TensorView& dgate, cudaStream_t stream) {
  ActCall c = make("geglu_backward", ActOp::kGeglu, true);
  c.dy = &dy, c.up = &hidden, c.gate = &gate, c.dup = &dhidden, c.dgate = &dgate, c.approx = approximate;
  return run(c, stream);
}

Status gelu_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                     cudaStream_t stream) {
  ActCall c = make("gelu_backward", ActOp::kGelu, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate;
  return run(c, stream);
}

}  // namespace kernelforge
