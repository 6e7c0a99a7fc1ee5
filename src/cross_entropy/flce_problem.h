// Internal description of one fused linear cross-entropy call (cross_entropy.h), shared by the chunk
// loop (flce.cpp), the float64 reference and the own kernels' launchers (flce_kernels.cu).
// validate_flce() (cross_entropy_validate.cpp) is the only place that checks its arguments.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device.h"
#include "kernelforge/cross_entropy.h"

namespace kernelforge {

struct FlceParams {
  DType dtype = DType::kFloat32;  // hidden's, weight's and bias's
  int64_t tokens = 0, hidden = 0, vocab = 0;
  int64_t ldh = 0;     // hidden's row stride
  int64_t ldw = 0;     // weight's row stride
  int64_t lddh = 0;    // dhidden's row stride
  int64_t lddw = 0;    // dweight's row stride
  bool grads = false;  // the forward computes gradients (any of dhidden, dweight, dbias given)
};

// backward: the backward entry (dloss given, reduction none); cuda = false: the reference (CPU tensors,
// float64 admitted).
Status validate_flce(const char* name, bool cuda, bool backward, const FlceTensors& t, const CrossEntropyOptions& o,
                     FlceParams* p);

// Vp: V rounded up so that a logits row is a multiple of 16 bytes (V itself when it already is).
int64_t flce_padded_vocab(int64_t vocab, DType dtype);

// The own kernels (flce_kernels.cu).
Status launch_flce_count_valid(const void* target, int64_t stride, bool target64, int64_t rows, int64_t ignore_index,
                               float* valid, float* one, const DeviceInfo& dev, cudaStream_t stream);
Status launch_flce_loss(const float* row_loss, int64_t rows, const float* valid, bool mean, float* loss,
                        const DeviceInfo& dev, cudaStream_t stream);
template <typename T>
Status launch_flce_column_sum(const void* dlogits, int64_t ld, int64_t rows, int64_t cols, float* acc,
                              const DeviceInfo& dev, cudaStream_t stream);

}  // namespace kernelforge
