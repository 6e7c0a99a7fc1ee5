// kernelforge cross-entropy family: the loss of logits against integer class targets, forward and
// backward, with ignore_index, label smoothing, z-loss and a Gemma-2-style logit softcap.
//
// Tensors:
//   logits [T, V]  rows (T tokens, V classes): one row stride, last dimension contiguous; float32,
//                  float16 or bfloat16 (bfloat16 needs sm_80+)
//   target [T]     int64 or int32, any stride; target[i] == ignore_index skips row i
//   row_loss, lse  [T] float32, contiguous (outputs)
//   loss, valid    [] (one element) float32 (outputs; loss is not written for Reduction::kNone)
//   dloss          float32: [] for kMean / kSum, [T] (any stride) for kNone
//   dlogits        logits' shape and dtype; may be logits itself (in place: the gradient overwrites
//                  the logits, as a fused linear cross-entropy does with each chunk)
//
// Formulas (float32 math, per valid row i with target t, eps = label_smoothing, z = z_loss_scale):
//   z_j     = softcap > 0 ? softcap * tanh(x_j / softcap) : x_j        (Gemma 2 final-logit softcap)
//   lse     = log sum_j exp(z_j)
//   row_loss= lse - (1 - eps) z_t - (eps / V) sum_j z_j + z * lse^2    (0 for an ignored row)
//   valid   = number of rows whose target != ignore_index
//   loss    = sum_i row_loss_i / valid (kMean; 0 / 0 = NaN when every row is ignored, as PyTorch),
//             sum_i row_loss_i (kSum)
// This is torch.nn.functional.cross_entropy(logits, target, ignore_index, label_smoothing) plus the
// z-loss (PaLM) and the softcap. Backward, p_j = exp(z_j - lse), G = dloss / valid (kMean), dloss
// (kSum) or dloss[i] (kNone); 0 for an ignored row:
//   dlogits_j = G * (p_j (1 + 2 z lse) - (1 - eps) [j == t] - eps / V) * (softcap > 0 ? 1 - (z_j / softcap)^2 : 1)
// A target outside [0, V) that is not ignore_index has no defined loss: on the GPU its row_loss,
// lse and gradient row are NaN (a device-side check without a host sync; the loss becomes NaN);
// the CPU reference returns an error naming the row.
//
// Vocabulary-parallel shards (tensor parallelism: each rank holds the logits of classes
// [class_start, class_start + V) of num_classes N): targets are global class indices in [0, N),
// t_local = t - class_start, z_t counts only when t_local is in [0, V), and eps / V becomes eps / N.
// The forward then gives the shard's terms: lse is the shard's log-sum-exp and
//   row_loss = lse - (1 - eps) z_t [t in shard] - (eps / N) sum_{j in shard} z_j + z * lse^2,
// so lse + z * lse^2 - row_loss is the part of the loss that adds up over the shards. The backward
// takes the global lse (combined over the shards by the caller: two all-reduces of [T] floats) and
// writes the shard's columns of the global gradient.
//
// Traffic: the forward reads the logits once; the backward reads them once more and writes the
// gradient once (3 passes in all).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class Reduction : int { kNone = 0, kMean = 1, kSum = 2 };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;  // in [0, 1]
  double z_loss_scale = 0.0;     // >= 0
  double softcap = 0.0;          // 0: none; > 0: softcap * tanh(x / softcap)
  Reduction reduction = Reduction::kMean;
  int64_t class_start = 0;  // a vocabulary shard: the logits hold classes [class_start, class_start + V)
  int64_t num_classes = 0;  //   of num_classes (0: the logits hold every class, num_classes = V)
};

// ---- CUDA ------------------------------------------------------------------------------------
// Writes row_loss, lse and valid, and loss unless reduction == kNone. Never synchronizes or
// allocates; `workspace` (bytes from cross_entropy_workspace_size, may be 0 -> null) holds partials.
size_t cross_entropy_workspace_size(int64_t tokens, int64_t vocab);
Status cross_entropy(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& opts,
                     const TensorView& row_loss, const TensorView& lse, const TensorView& loss, const TensorView& valid,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream);
Status cross_entropy_backward(const TensorView& dloss, const TensorView& logits, const TensorView& target,
                              const TensorView& lse, const TensorView& valid, const CrossEntropyOptions& opts,
                              const TensorView& dlogits, cudaStream_t stream);

// ---- float64 CPU reference (the test oracle and the CPU implementation of the ops) -----------
namespace ref {
Status cross_entropy(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& opts,
                     const TensorView& row_loss, const TensorView& lse, const TensorView& loss,
                     const TensorView& valid);
Status cross_entropy_backward(const TensorView& dloss, const TensorView& logits, const TensorView& target,
                              const TensorView& lse, const TensorView& valid, const CrossEntropyOptions& opts,
                              const TensorView& dlogits);
}  // namespace ref

}  // namespace kernelforge
