// Developer tool: how many clusters of C CTAs the GPU keeps resident at once (cudaOccupancyMaxActiveClusters),
// for CTAs that take one SM each (large dynamic shared memory) or several. Clusters are placed inside one
// GPC, so C × clusters can be below the SM count: those SMs idle under a persistent cluster kernel.
//     built by dev/CMakeLists.txt (sm_90a), or: nvcc -arch=sm_90a -o /tmp/cluster_occupancy dev/cluster_occupancy.cu
#include <cuda_runtime.h>

#include <cstdio>

__global__ void probe(int* out) {
  extern __shared__ int smem[];
  if (out) out[blockIdx.x] = smem[threadIdx.x];
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("SMs %d\n", sms);
  const int smem_kb[] = {200, 100, 64, 32};
  for (int kb : smem_kb) {
    std::printf("smem %3d KB, 512 threads:", kb);
    for (int c = 1; c <= 16; ++c) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(c * 64);
      cfg.blockDim = dim3(512);
      cfg.dynamicSmemBytes = size_t(kb) * 1024;
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = c;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, probe, &cfg) != cudaSuccess) {
        cudaGetLastError();
        n = -1;
      }
      std::printf(" C%d:%d(%d)", c, n, n * c);
    }
    std::printf("\n");
  }
  return 0;
}
