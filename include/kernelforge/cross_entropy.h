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

#include <cstddef>
#include <cstdint>
#include <string>

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

// ---- fused linear cross-entropy --------------------------------------------------------------
// The loss of logits = hidden weight^T (+ bias) without the [T, V] logits, chunk by chunk of C tokens:
//   logits_c = hidden_c weight^T (+ bias)         the GEMM family (cuBLASLt), [C, V] in the weight's dtype
//   row_loss_c, lse_c = cross_entropy(logits_c)    this family's forward (one read of the chunk)
// and, when gradients are asked for (reduction mean or sum; they are the gradients of a loss gradient
// of 1: the caller scales them by its own, which is known only after the forward):
//   logits_c <- dlogits_c                         this family's backward, in place
//   dhidden_c = dlogits_c weight,  dweight += dlogits_c^T hidden_c,  dbias += sum over rows of dlogits_c
// The backward entry (reduction none: the per-row gradient dloss [T] comes after the forward)
// recomputes each chunk's logits and writes the same three gradients for dloss.
//
// Tensors:
//   hidden  [T, H]   stride 1 along H; weight [V, H] stride 1 along H; bias optional [V] contiguous;
//                    one dtype: float16, bfloat16 or float32
//   target  [T]      int64 or int32, any stride (as cross_entropy)
//   row_loss, lse [T] float32 contiguous; valid [] float32 (rows whose target != ignore_index, over all
//                    T); loss [] float32 (reduction mean / sum)
//   dhidden [T, H] hidden's dtype, dweight [V, H] weight's dtype (both stride 1 along H), dbias [V]
//                    float32 contiguous: each optional
//   dloss   [T] float32, any stride: the backward entry's input
// Options: cross_entropy's, without vocabulary shards (class_start 0, num_classes 0).
// FLOPs: 2 T V H for the logits, 4 T V H more for dhidden and dweight.
// Extra memory (the workspace): one [C, Vp] logits chunk; for a vocabulary whose weight rows do not
// make 16-byte aligned logits rows (V * sizeof(T) % 16 != 0, e.g. GPT-2's 50257) a zero-padded copy of
// the weight (and bias) with Vp rows, since cuBLASLt runs odd N and K several times slower; the
// cross-entropy partials; cuBLASLt's workspace.
struct FlceTensors {
  const TensorView* hidden = nullptr;
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;  // optional
  const TensorView* target = nullptr;
  const TensorView* row_loss = nullptr;
  const TensorView* lse = nullptr;
  const TensorView* valid = nullptr;
  const TensorView* loss = nullptr;     // reduction mean / sum
  const TensorView* dhidden = nullptr;  // optional
  const TensorView* dweight = nullptr;  // optional
  const TensorView* dbias = nullptr;    // optional (with bias)
  const TensorView* dloss = nullptr;    // the backward entry
};

// chunk_tokens: C; padded_vocab: Vp (V unless the weight is padded); workspace: bytes.
struct FlcePlan {
  int64_t chunk_tokens = 0;
  int64_t padded_vocab = 0;
  size_t workspace = 0;
};
std::string to_string(const FlcePlan& plan);  // e.g. "flce chunk=2048 vocab=128256 ws=1073741824"

// chunk_tokens 0: chunks of at most 1 GiB of logits and an eighth of the [T, V] float32 logits an
// unfused loss would hold (so at least 4 chunks), in multiples of 128 tokens; a caller that knows its
// free memory passes a smaller count. The plan reads shapes only (the backward entry takes the same plan).
Status fused_linear_cross_entropy_plan(const FlceTensors& t, const CrossEntropyOptions& opts, int64_t chunk_tokens,
                                       FlcePlan* plan, size_t* workspace_bytes);
// Writes row_loss, lse, valid, loss (reduction mean / sum) and the gradients given.
Status fused_linear_cross_entropy(const FlcePlan& plan, const FlceTensors& t, const CrossEntropyOptions& opts,
                                  void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Reduction none: the gradients for dloss (lse: the forward's); row_loss, valid and loss are not used.
Status fused_linear_cross_entropy_backward(const FlcePlan& plan, const FlceTensors& t, const CrossEntropyOptions& opts,
                                           void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference (the test oracle and the CPU implementation of the ops) -----------
namespace ref {
// The fused linear cross-entropy of the same tensors in double: the whole [T, V] logits, one rounding
// of each output.
Status fused_linear_cross_entropy(const FlceTensors& t, const CrossEntropyOptions& opts);
Status fused_linear_cross_entropy_backward(const FlceTensors& t, const CrossEntropyOptions& opts);
Status cross_entropy(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& opts,
                     const TensorView& row_loss, const TensorView& lse, const TensorView& loss,
                     const TensorView& valid);
Status cross_entropy_backward(const TensorView& dloss, const TensorView& logits, const TensorView& target,
                              const TensorView& lse, const TensorView& valid, const CrossEntropyOptions& opts,
                              const TensorView& dlogits);
}  // namespace ref

}  // namespace kernelforge
