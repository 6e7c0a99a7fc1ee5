// Thread-block clusters (sm_90), shared by the kernel families that split a row over the CTAs of a
// cluster: the CTA's rank, the exit barrier, the gather that finishes a reduction over the ranks,
// and the row sequence of a persistent grid of clusters. Below sm_90 a "cluster" is one CTA.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kernelforge {

constexpr int kMaxCluster = 8;  // the portable cluster size limit (cluster_gather's lanes rely on it)

__device__ __forceinline__ int cluster_rank(int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) return int(cooperative_groups::this_cluster().block_rank());
#endif
  (void)cluster;
  return 0;
}

// No CTA may exit while another CTA of its cluster may still read its shared memory.
__device__ __forceinline__ void cluster_exit_sync(int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) cooperative_groups::this_cluster().sync();
#endif
  (void)cluster;
}

// Every CTA of the cluster publishes v (thread 0 writes it to *pub, in its own shared memory); after one
// cluster barrier (release/acquire), lane r < cluster of every warp returns rank r's value and the other
// lanes return `none`. The caller folds the 32 lanes with a xor butterfly, which leaves identical bits
// in every thread of the cluster. All ranks' values are read by one warp-wide load (one distributed
// shared memory round trip); a loop over the ranks per thread paid `cluster` round trips in sequence.
// *pub is double-buffered by the caller: a CTA may publish its next value while a slower CTA still
// reads this one (the next call's barrier orders the one after).
template <typename V>
__device__ __forceinline__ V cluster_gather(const V& v, V* pub, int cluster, const V& none) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) *pub = v;
  cl.sync();
  const int lane = int(threadIdx.x) & 31;
  return lane < cluster ? *cl.map_shared_rank(pub, lane) : none;
#else
  (void)pub;
  (void)cluster;
  return (threadIdx.x & 31) == 0 ? v : none;
#endif
}

// The rows of a persistent grid of clusters: cluster c = blockIdx.x / C of G = gridDim.x / C takes rows
// c, c + G, c + 2G, ...; (*this)(k) is its k-th row, or -1 past the last row.
struct ClusterRows {
  int64_t first, step, rows;
  __device__ __forceinline__ ClusterRows(int64_t rows_, int cluster)
      : first(blockIdx.x / cluster), step(gridDim.x / cluster), rows(rows_) {}
  __device__ __forceinline__ int64_t operator()(int64_t k) const {
    const int64_t r = first + k * step;
    return r < rows ? r : int64_t(-1);
  }
};

// The columns of a row that CTA rank r of a cluster of C owns: [col0, col0 + len), len = n / C (the
// host guarantees C | n and 16-byte slices); nvec vectors of kVec elements, `bytes` bytes.
template <typename T, int kVec>
struct RowSlice {
  int len, col0, nvec;
  uint32_t bytes;
  __device__ __forceinline__ RowSlice(int64_t n, int cluster)
      : len(int(n / cluster)),
        col0(cluster_rank(cluster) * len),
        nvec(len / kVec),
        bytes(uint32_t(len) * uint32_t(sizeof(T))) {}
};

}  // namespace kernelforge
