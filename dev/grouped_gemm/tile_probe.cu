// Probe: one CUTLASS sm_90a grouped-GEMM configuration (tile, cluster, schedule) for one operand
// layout, timed on grouped_mm's shapes against a loop of cuBLAS GEMMs: the numbers behind grouped_mm's
// tile table (notes/grouped_mm.md). The configuration is fixed at compile time:
//   -DTM=128 -DTN=256 -DTK=64     tile (rows of a group x columns x reduction step)
//   -DCM=2 -DCN=1                 cluster shape
//   -DPINGPONG=0|1                cooperative (two consumer warpgroups on one tile) or ping-pong
//   -DB_ROW=0|1                   B's layout: 0 = K-contiguous weights (the forward), 1 = N-contiguous
//                                 (dx = dy w[e]: w's transposed view)
// Build, one line per configuration:
//   nvcc -std=c++17 -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -isystem $CUTLASS/include
//        -DTM=64 -DTN=128 -DTK=128 -DCM=1 -DCN=2 -DPINGPONG=1 -DB_ROW=1 dev/grouped_gemm/tile_probe.cu
//        -lcublas -o _build/tile_probe_64x128_pp_brow
// Run: tile_probe [E T N K] ... (several shapes; default the bench's): per shape, TFLOP/s of the grouped
// GEMM and of the cuBLAS loop, skewed routing (expert e's share ~ e + 1), after a check against the loop.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#ifndef TM
#define TM 128
#define TN 256
#define TK 64
#define CM 2
#define CN 1
#define PINGPONG 0
#endif
#ifndef B_ROW
#define B_ROW 0
#endif

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

using namespace cute;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Elem = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = std::conditional_t<B_ROW, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
using LayoutD = cutlass::layout::RowMajor;
using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
using ClusterShape = Shape<Int<CM>, Int<CN>, _1>;
using KernelSchedule = std::conditional_t<PINGPONG, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
using EpilogueSchedule = std::conditional_t<PINGPONG, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                            cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, 8, Elem, LayoutD*, 8,
    EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<Elem, float, void>>::CollectiveOp;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, LayoutA*, 8, Elem, LayoutB*, 8, float, TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>>;
using StrideA = typename Gemm::GemmKernel::InternalStrideA;
using StrideB = typename Gemm::GemmKernel::InternalStrideB;
using StrideD = typename Gemm::GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// Group e: rows [ends[e-1], ends[e]) of x [T, K]; w [E, N, K] (B_ROW: [E, K, N], N contiguous).
__global__ void setup(const int* ends, int E, int N, int K, const Elem* x, const Elem* w, Elem* out, Shape3* shapes,
                      const Elem** pa, const Elem** pb, Elem** pd, StrideA* sa, StrideB* sb, StrideD* sd) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  const int lo = e == 0 ? 0 : ends[e - 1], hi = ends[e];
  shapes[e] = Shape3(hi - lo, N, K);
  pa[e] = x + int64_t(lo) * K;
  pb[e] = w + int64_t(e) * N * K;
  pd[e] = out + int64_t(lo) * N;
  sa[e] = cutlass::make_cute_packed_stride(StrideA{}, {hi - lo, K, 1});
  sb[e] = cutlass::make_cute_packed_stride(StrideB{}, {N, K, 1});
  sd[e] = cutlass::make_cute_packed_stride(StrideD{}, {hi - lo, N, 1});
}

__global__ void fill(Elem* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = Elem(float(h & 0xffff) / 32768.0f - 1.0f);
  }
}

template <class F>
float time_ms(F&& fn) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < 15; ++i) {
    cudaEventRecord(t0);
    fn();
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    float v;
    cudaEventElapsedTime(&v, t0, t1);
    ms.push_back(v);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run_shape(int E, int T, int N, int K, cublasHandle_t h) {
  std::vector<int> ends(E);
  double total = 0, acc = 0;
  for (int e = 0; e < E; ++e) total += e + 1.0;
  for (int e = 0; e < E; ++e) ends[e] = int(std::lround((acc += e + 1.0) / total * T));
  ends[E - 1] = T;
  Elem *x, *w, *out, *ref;
  CHECK_CUDA(cudaMalloc(&x, sizeof(Elem) * size_t(T) * K));
  CHECK_CUDA(cudaMalloc(&w, sizeof(Elem) * size_t(E) * N * K));
  CHECK_CUDA(cudaMalloc(&out, sizeof(Elem) * size_t(T) * N));
  CHECK_CUDA(cudaMalloc(&ref, sizeof(Elem) * size_t(T) * N));
  fill<<<1024, 256>>>(x, int64_t(T) * K, 1u);
  fill<<<1024, 256>>>(w, int64_t(E) * N * K, 2u);
  int* d_ends;
  CHECK_CUDA(cudaMalloc(&d_ends, sizeof(int) * E));
  CHECK_CUDA(cudaMemcpy(d_ends, ends.data(), sizeof(int) * E, cudaMemcpyHostToDevice));
  Shape3* shapes;
  const Elem **pa, **pb;
  Elem** pd;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  CHECK_CUDA(cudaMalloc(&shapes, sizeof(Shape3) * E));
  CHECK_CUDA(cudaMalloc(&pa, sizeof(void*) * E));
  CHECK_CUDA(cudaMalloc(&pb, sizeof(void*) * E));
  CHECK_CUDA(cudaMalloc(&pd, sizeof(void*) * E));
  CHECK_CUDA(cudaMalloc(&sa, sizeof(StrideA) * E));
  CHECK_CUDA(cudaMalloc(&sb, sizeof(StrideB) * E));
  CHECK_CUDA(cudaMalloc(&sd, sizeof(StrideD) * E));
  typename Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {E, shapes, nullptr};
  args.mainloop = {pa, sa, pb, sb};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = pd;
  args.epilogue.dD = sd;
  args.hw_info = cutlass::KernelHardwareInfo::make_kernel_hardware_info<typename Gemm::GemmKernel>(0);
  void* ws = nullptr;
  const size_t bytes = Gemm::get_workspace_size(args);
  if (bytes) CHECK_CUDA(cudaMalloc(&ws, bytes));
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
    std::printf("can_implement failed\n");
    return;
  }
  auto grouped = [&]() {
    setup<<<(E + 127) / 128, 128>>>(d_ends, E, N, K, x, w, out, shapes, pa, pb, pd, sa, sb, sd);
    gemm.initialize(args, ws);
    gemm.run();
  };
  const float one = 1.0f, zero = 0.0f;
  // cuBLAS, column-major view: out^T [N, T_e] = B_e (N x K op) . x_e^T; w[e] is K x N col-major (B_ROW: N x K).
  auto loop = [&]() {
    int lo = 0;
    for (int e = 0; e < E; ++e) {
      const int m = ends[e] - lo;
      if (m > 0)
        cublasGemmEx(h, B_ROW ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &one, w + size_t(e) * N * K,
                     CUDA_R_16BF, B_ROW ? N : K, x + size_t(lo) * K, CUDA_R_16BF, K, &zero, ref + size_t(lo) * N,
                     CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      lo = ends[e];
    }
  };
  grouped();
  loop();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<Elem> a(size_t(T) * N), b(size_t(T) * N);
  CHECK_CUDA(cudaMemcpy(a.data(), out, sizeof(Elem) * a.size(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), ref, sizeof(Elem) * b.size(), cudaMemcpyDeviceToHost));
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::fabs(double(float(a[i])) - double(float(b[i]))));
  const double tf = 2.0 * double(T) * N * K / 1e9;
  const float tg = time_ms(grouped), tl = time_ms(loop);
  std::printf("tile %dx%dx%d cluster %dx%d %s b_%s | e%d t%d n%d k%d | grouped %.3f ms %.1f TF/s | loop %.3f ms %.1f "
              "TF/s | %.2fx | max err %.3g\n",
              TM, TN, TK, CM, CN, PINGPONG ? "pingpong" : "cooperative", B_ROW ? "row" : "col", E, T, N, K, tg,
              tf / tg, tl, tf / tl, tl / tg, err);
  cudaFree(x), cudaFree(w), cudaFree(out), cudaFree(ref), cudaFree(d_ends), cudaFree(shapes), cudaFree(pa);
  cudaFree(pb), cudaFree(pd), cudaFree(sa), cudaFree(sb), cudaFree(sd);
  if (ws) cudaFree(ws);
}

int main(int argc, char** argv) {
  cublasHandle_t h;
  cublasCreate(&h);
  if (argc >= 5) {
    for (int i = 1; i + 3 < argc; i += 4)
      run_shape(std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2]), std::atoi(argv[i + 3]), h);
    return 0;
  }
  // the bench's shapes (E, T, N, K); with B_ROW these are dx's shapes (N and K of the forward swapped)
  const int shapes[][4] = {{8, 16384, 14336, 4096}, {64, 16384, 1536, 4096}, {64, 16384, 4096, 1536},
                           {128, 16384, 768, 2048}, {8, 16384, 4096, 14336}};
  for (const auto& s : shapes) run_shape(s[0], s[1], s[2], s[3], h);
  return 0;
}
