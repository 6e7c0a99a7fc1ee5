// Launchers of the fused linear cross-entropy's own kernels (the GEMMs are the GEMM family's, the loss
// and its gradient this family's cross_entropy kernels): the valid count, the final loss and the bias
// gradient's column sums, the last instantiated for each dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/launch.cuh"
#include "common/math.h"
#include "cross_entropy/flce_problem.h"
#include "cross_entropy/kernels/flce_column_sum.cuh"
#include "cross_entropy/kernels/flce_count_valid.cuh"
#include "cross_entropy/kernels/flce_loss.cuh"

namespace kernelforge {

Status launch_flce_count_valid(const void* target, int64_t stride, bool target64, int64_t rows, int64_t ignore_index,
                               float* valid, float* one, const DeviceInfo& dev, cudaStream_t stream) {
  Launch launch(dim3(1), dim3(kFlceCountThreads), 0, stream, use_pdl(dev));
  return launched(launch(flce_count_valid, target, stride, target64, rows, ignore_index, valid, one),
                  "fused_linear_cross_entropy (valid count)");
}

Status launch_flce_loss(const float* row_loss, int64_t rows, const float* valid, bool mean, float* loss,
                        const DeviceInfo& dev, cudaStream_t stream) {
  Launch launch(dim3(1), dim3(kFlceLossThreads), 0, stream, use_pdl(dev));
  return launched(launch(flce_loss, row_loss, rows, valid, mean, loss), "fused_linear_cross_entropy (loss)");
}

template <typename T>
Status launch_flce_column_sum(const void* dlogits, int64_t ld, int64_t rows, int64_t cols, float* acc,
                              const DeviceInfo& dev, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return Status::Ok();
  Launch launch(dim3(unsigned(ceil_div(cols, kFlceColumnThreads))), dim3(kFlceColumnThreads), 0, stream, use_pdl(dev));
  return launched(launch(flce_column_sum<T>, static_cast<const T*>(dlogits), ld, rows, cols, acc),
                  "fused_linear_cross_entropy (bias sums)");
}

template Status launch_flce_column_sum<float>(const void*, int64_t, int64_t, int64_t, float*, const DeviceInfo&,
                                              cudaStream_t);
template Status launch_flce_column_sum<__half>(const void*, int64_t, int64_t, int64_t, float*, const DeviceInfo&,
                                               cudaStream_t);
template Status launch_flce_column_sum<__nv_bfloat16>(const void*, int64_t, int64_t, int64_t, float*, const DeviceInfo&,
                                                      cudaStream_t);

}  // namespace kernelforge
