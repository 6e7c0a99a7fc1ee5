// Public entry points of the cross-entropy family: validate (cross_entropy_validate.cpp), check the
// device and workspace, dispatch the dtype once, launch (cross_entropy_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/device.h"
#include "cross_entropy/cross_entropy_problem.h"

namespace kernelforge {

// 256 threads x 8 vectors of 16 bytes: 16384 bf16/fp16 or 8192 fp32 logits per forward CTA
// (ce_seg_len<T>() in the kernels; the workspace is sized for the float32 count, the largest).
int64_t ce_segment_len(DType t) { return t == DType::kFloat32 ? 8192 : 16384; }
int64_t ce_segments(int64_t vocab, DType t) { return (vocab + ce_segment_len(t) - 1) / ce_segment_len(t); }
size_t ce_workspace_bytes(int64_t rows, int64_t vocab, DType t) {
  const int64_t nfin = (rows + kCeFinalizeBlock - 1) / kCeFinalizeBlock;
  return size_t(rows * ce_segments(vocab, t)) * 16 + size_t(nfin) * 8 + 16;
}
size_t cross_entropy_workspace_size(int64_t tokens, int64_t vocab) {
  return ce_workspace_bytes(tokens, vocab, DType::kFloat32);
}

namespace {

Status check_device(const CeCall& c, DType dtype, CeParams* p) {
  int dev = 0;
  const DeviceInfo* info = nullptr;
  Status s = current_device_info(&dev, &info);
  if (!s.ok()) return Status(s.code(), std::string(c.name) + ": " + s.message());
  if (c.logits->device.index != dev)
    return Status::Invalid(std::string(c.name) + ": inputs are on cuda:" + std::to_string(c.logits->device.index) +
                           " but the current CUDA device is cuda:" + std::to_string(dev));
  if (dtype == DType::kBFloat16 && info->capability < 80)
    return Status::NotSupported(std::string(c.name) +
                                ": bfloat16 needs a GPU of compute capability 8.0 or newer, this one is sm_" +
                                std::to_string(info->capability) + "; use float16 or float32");
  p->capability = info->capability;
  p->sm_count = info->sm_count;
  return Status::Ok();
}

}  // namespace

Status cross_entropy(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& opts,
                     const TensorView& row_loss, const TensorView& lse, const TensorView& loss, const TensorView& valid,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  CeCall c;
  c.name = "cross_entropy";
  c.opts = opts;
  c.logits = &logits, c.target = &target, c.row_loss = &row_loss, c.lse_out = &lse, c.loss = &loss,
  c.valid_out = &valid;
  CeParams p;
  DType dtype;
  Status s = validate_cross_entropy(c, &p, &dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c, dtype, &p)).ok()) return s;
  const size_t need = ce_workspace_bytes(p.rows, p.vocab, dtype);
  if (workspace_bytes < need || (workspace == nullptr && need > 0))
    return Status::Invalid("cross_entropy: workspace must hold at least " + std::to_string(need) +
                           " bytes (cross_entropy_workspace_size), got " + std::to_string(workspace_bytes));
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return Status::Invalid("cross_entropy: workspace must be 16-byte aligned");
  switch (dtype) {
    case DType::kFloat32:
      return launch_ce_fwd<float>(p, workspace, stream);
    case DType::kFloat16:
      return launch_ce_fwd<__half>(p, workspace, stream);
    case DType::kBFloat16:
      return launch_ce_fwd<__nv_bfloat16>(p, workspace, stream);
    default:
      return Status::Invalid("cross_entropy: unsupported dtype");
  }
}

Status cross_entropy_backward(const TensorView& dloss, const TensorView& logits, const TensorView& target,
                              const TensorView& lse, const TensorView& valid, const CrossEntropyOptions& opts,
                              const TensorView& dlogits, cudaStream_t stream) {
  CeCall c;
  c.name = "cross_entropy_backward";
  c.backward = true;
  c.opts = opts;
  c.dloss = &dloss, c.logits = &logits, c.target = &target, c.lse = &lse, c.valid = &valid, c.dlogits = &dlogits;
  CeParams p;
  DType dtype;
  Status s = validate_cross_entropy(c, &p, &dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c, dtype, &p)).ok()) return s;
  switch (dtype) {
    case DType::kFloat32:
      return launch_ce_bwd<float>(p, stream);
    case DType::kFloat16:
      return launch_ce_bwd<__half>(p, stream);
    case DType::kBFloat16:
      return launch_ce_bwd<__nv_bfloat16>(p, stream);
    default:
      return Status::Invalid("cross_entropy_backward: unsupported dtype");
  }
}

}  // namespace kernelforge
