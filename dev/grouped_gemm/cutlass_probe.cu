// Probe: CUTLASS's sm_90a grouped GEMM (TMA + wgmma, warp-specialized cooperative, a persistent tile
// scheduler over (group, tile) work) driven by device-side offsets, for the two MoE products
//   forward:        out[T, N] rows of expert e = x_e [T_e, K] . w[e]^T,   w [E, N, K]
//   weight grad:    dw[e] [N, K] = dy_e^T [N, T_e] . x_e [T_e, K]          (variable K = T_e; an empty
//                   expert's dw is zero)
// with offsets int32 [E] (group ends), each against a loop of cuBLAS GEMMs (one per expert, sizes
// known on the host). The group sizes never reach the host: a setup kernel turns the offsets into CUTLASS's
// per-group problem shapes, pointers and strides (CUDA-graph safe), which is what a library call
// with torch._grouped_mm's contract needs.
//
// Build (CUTLASS headers from the pip package nvidia-cutlass, CUTLASS=<site>/cutlass_library/source), one line:
//   nvcc -std=c++17 -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -isystem $CUTLASS/include
//        -isystem $CUTLASS/tools/util/include dev/grouped_gemm/cutlass_probe.cu -lcublas -o _build/cutlass_probe
// (-DNDEBUG matters: the device-side asserts are calls, and ptxas serializes the wgmma pipeline across
// them.) On the GPU machine the headers come from the carried wheel, which scripts/gpu_run.sh installs
// into /tmp/site: CUTLASS=/tmp/site/cutlass_library/source.
// Run: _build/cutlass_probe [E T K N skew]   (default 8 16384 4096 14336 1; skew 1: expert e gets a share
// proportional to e + 1, 0: equal)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
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

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

using namespace cute;

// ---- the kernel type: bf16 in, float32 accumulation, bf16 out; A row-major [M, K] (x_e), B [N, K]
// row-major = CUTLASS's column-major K x N (w[e]), D row-major [M, N]; no C operand (beta = 0).
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using Elem = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 8;                  // elements per 16 bytes: TMA wants 16-byte rows
using TileShape = Shape<_128, _256, _64>;  // 128 x 256 output tile, 64-deep K slices (128 bytes)
using ClusterShape = Shape<_2, _1, _1>;    // B tiles multicast to the CTA pair
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign, Elem, LayoutD*, kAlign,
    EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<Elem, float, void>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, LayoutA*, kAlign, Elem, LayoutB*, kAlign, float,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using StrideA = typename Gemm::GemmKernel::InternalStrideA;
using StrideB = typename Gemm::GemmKernel::InternalStrideB;
using StrideD = typename Gemm::GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// The weight gradient: per group M = N, N = K, K = T_e; A = dy_e^T (column-major: dy [T, N] row-major),
// B = x_e as CUTLASS's K x N operand with N contiguous (row-major), D = dw[e] row-major [N, K].
using WEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign, Elem, LayoutD*, kAlign,
    EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<Elem, float, void>>::CollectiveOp;
using WMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, cutlass::layout::ColumnMajor*, kAlign, Elem,
    cutlass::layout::RowMajor*, kAlign, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename WEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;
using WKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, WMainloop, WEpilogue>;
using WGemm = cutlass::gemm::device::GemmUniversalAdapter<WKernel>;
using WStrideA = typename WGemm::GemmKernel::InternalStrideA;
using WStrideB = typename WGemm::GemmKernel::InternalStrideB;
using WStrideD = typename WGemm::GemmKernel::InternalStrideD;

// dy [T, N], x [T, K], dw [E, N, K]: group e's M = N, N = K, K = its rows.
__global__ void setup_wgrad(const int* offsets, int E, int T, int N, int K, const Elem* dy, const Elem* x, Elem* dw,
                            Shape3* shapes, const Elem** pa, const Elem** pb, Elem** pd, WStrideA* sa, WStrideB* sb,
                            WStrideD* sd) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  const int lo = e == 0 ? 0 : min(max(offsets[e - 1], 0), T);
  const int hi = min(max(offsets[e], lo), T);
  shapes[e] = Shape3(N, K, hi - lo);
  pa[e] = dy + int64_t(lo) * N;
  pb[e] = x + int64_t(lo) * K;
  pd[e] = dw + int64_t(e) * N * K;
  // A column-major M x K' with leading dimension N (dy's row stride); B K' x N' with N' contiguous,
  // leading dimension K (x's row stride); D row-major [N, K].
  sa[e] = cutlass::make_cute_packed_stride(WStrideA{}, {N, hi - lo, 1});
  sb[e] = cutlass::make_cute_packed_stride(WStrideB{}, {K, hi - lo, 1});
  sd[e] = cutlass::make_cute_packed_stride(WStrideD{}, {N, K, 1});
}

// Per-group arguments from the offsets, on the device (group e: rows [offsets[e-1], offsets[e]),
// clamped to [0, T] so bad offsets never address memory outside x and out).
__global__ void setup_groups(const int* offsets, int E, int T, int N, int K, const Elem* x, const Elem* w, Elem* out,
                             Shape3* shapes, const Elem** pa, const Elem** pb, Elem** pd, StrideA* sa, StrideB* sb,
                             StrideD* sd) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  const int lo = e == 0 ? 0 : min(max(offsets[e - 1], 0), T);
  const int hi = min(max(offsets[e], lo), T);
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

// One grouped GEMM type with its arguments (D = A B per group, no C operand; shapes, pointers and
// strides read from the device arrays at run time) and workspace.
template <class G>
struct Grouped {
  using K = typename G::GemmKernel;
  G gemm;
  typename G::Arguments args;
  void* ws = nullptr;
  bool init(int E, Shape3* shapes, const Elem** pa, typename K::InternalStrideA* sa, const Elem** pb,
            typename K::InternalStrideB* sb, Elem** pd, typename K::InternalStrideD* sd, const char* what) {
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {E, shapes, nullptr};  // no host copy of the shapes: the offsets stay on the device
    args.mainloop = {pa, sa, pb, sb};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = pd;
    args.epilogue.dD = sd;
    args.hw_info = cutlass::KernelHardwareInfo::make_kernel_hardware_info<K>(0);
    const size_t bytes = G::get_workspace_size(args);
    if (bytes) CHECK_CUDA(cudaMalloc(&ws, bytes));
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
      std::printf("%s: can_implement failed\n", what);
      return false;
    }
    return true;
  }
  void run() {
    if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) std::printf("initialize failed\n");
    if (gemm.run() != cutlass::Status::kSuccess) std::printf("run failed\n");
  }
};

// Largest |a - b| and |b| over n device elements, and a's non-finite count.
struct Diff {
  double err = 0, ref = 0;
  size_t bad = 0;
};
Diff compare(const Elem* a_dev, const Elem* b_dev, size_t n) {
  std::vector<Elem> a(n), b(n);
  CHECK_CUDA(cudaMemcpy(a.data(), a_dev, sizeof(Elem) * n, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), b_dev, sizeof(Elem) * n, cudaMemcpyDeviceToHost));
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    const double u = float(a[i]), v = float(b[i]);
    if (!std::isfinite(u)) ++d.bad;
    d.err = std::max(d.err, std::fabs(u - v));
    d.ref = std::max(d.ref, std::fabs(v));
  }
  return d;
}

int main(int argc, char** argv) {
  const int E = argc > 1 ? std::atoi(argv[1]) : 8;
  const int T = argc > 2 ? std::atoi(argv[2]) : 16384;
  const int K = argc > 3 ? std::atoi(argv[3]) : 4096;
  const int N = argc > 4 ? std::atoi(argv[4]) : 14336;
  const int skew = argc > 5 ? std::atoi(argv[5]) : 1;

  // Group ends: shares e + 1 (skew) or equal, one empty group when E > 2 (expert 1).
  std::vector<int> ends(E);
  {
    double total = 0;
    std::vector<double> share(E);
    for (int e = 0; e < E; ++e) total += share[e] = (E > 2 && e == 1) ? 0.0 : (skew ? e + 1.0 : 1.0);
    double acc = 0;
    for (int e = 0; e < E; ++e) ends[e] = int(std::lround((acc += share[e]) / total * T));
    ends[E - 1] = T;
  }

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

  Grouped<Gemm> fwd_gemm;
  if (!fwd_gemm.init(E, shapes, pa, sa, pb, sb, pd, sd, "forward")) return 1;
  auto run_grouped = [&]() {
    setup_groups<<<(E + 127) / 128, 128>>>(d_ends, E, T, N, K, x, w, out, shapes, pa, pb, pd, sa, sb, sd);
    fwd_gemm.run();
  };

  // The cuBLAS loop (column-major view: out^T [N, T_e] = w_e [N, K] (K x N col-major, transposed) .
  // x_e^T (K x T_e col-major)).
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1.0f, zero = 0.0f;
  auto run_loop = [&](Elem* dst) {
    int lo = 0;
    for (int e = 0; e < E; ++e) {
      const int m = ends[e] - lo;
      if (m > 0)
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &one, w + size_t(e) * N * K, CUDA_R_16BF, K,
                     x + size_t(lo) * K, CUDA_R_16BF, K, &zero, dst + size_t(lo) * N, CUDA_R_16BF, N,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      lo = ends[e];
    }
  };

  CHECK_CUDA(cudaMemset(out, 0xff, sizeof(Elem) * size_t(T) * N));  // NaN poison
  run_grouped();
  run_loop(ref);
  CHECK_CUDA(cudaDeviceSynchronize());
  const Diff fwd = compare(out, ref, size_t(T) * N);
  std::printf("E %d T %d K %d N %d skew %d, forward: max |grouped - cuBLAS| %.3g (max |ref| %.3g), non-finite %zu\n", E,
              T, K, N, skew, fwd.err, fwd.ref, fwd.bad);

  auto time_ms = [&](auto&& fn) {
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    for (int i = 0; i < 3; ++i) fn();
    std::vector<float> ms;
    for (int i = 0; i < 10; ++i) {
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
  };
  const double flops = 2.0 * double(T) * N * K;
  const float tg = time_ms(run_grouped), tl = time_ms([&]() { run_loop(ref); });
  std::printf(
      "forward: grouped (CUTLASS, device offsets) %.3f ms %.1f TFLOP/s | cuBLAS loop %.3f ms %.1f TFLOP/s | %.2fx\n",
      tg, flops / tg / 1e9, tl, flops / tl / 1e9, tl / tg);

  // ---- the weight gradient: dy = the forward's out (any [T, N] values do), dw [E, N, K] ----
  Elem *dw, *dw_ref;
  CHECK_CUDA(cudaMalloc(&dw, sizeof(Elem) * size_t(E) * N * K));
  CHECK_CUDA(cudaMalloc(&dw_ref, sizeof(Elem) * size_t(E) * N * K));
  fill<<<1024, 256>>>(ref, int64_t(T) * N, 3u);  // dy
  WStrideA* wsa;
  WStrideB* wsb;
  WStrideD* wsd;
  CHECK_CUDA(cudaMalloc(&wsa, sizeof(WStrideA) * E));
  CHECK_CUDA(cudaMalloc(&wsb, sizeof(WStrideB) * E));
  CHECK_CUDA(cudaMalloc(&wsd, sizeof(WStrideD) * E));
  Grouped<WGemm> w_gemm;
  if (!w_gemm.init(E, shapes, pa, wsa, pb, wsb, pd, wsd, "weight grad")) return 1;
  auto run_wgrad = [&]() {
    setup_wgrad<<<(E + 127) / 128, 128>>>(d_ends, E, T, N, K, ref, x, dw, shapes, pa, pb, pd, wsa, wsb, wsd);
    w_gemm.run();
  };
  // cuBLAS loop, column-major view: dw_e^T [K, N] = x_e^T [K, T_e] . dy_e [T_e, N]; empty experts zeroed.
  auto run_wloop = [&](Elem* dst) {
    int lo = 0;
    for (int e = 0; e < E; ++e) {
      const int m = ends[e] - lo;
      Elem* d = dst + size_t(e) * N * K;
      if (m > 0)
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, K, N, m, &one, x + size_t(lo) * K, CUDA_R_16BF, K,
                     ref + size_t(lo) * N, CUDA_R_16BF, N, &zero, d, CUDA_R_16BF, K, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      else
        cudaMemsetAsync(d, 0, sizeof(Elem) * size_t(N) * K);
      lo = ends[e];
    }
  };
  CHECK_CUDA(cudaMemset(dw, 0xff, sizeof(Elem) * size_t(E) * N * K));  // NaN poison: an empty expert must write zeros
  run_wgrad();
  run_wloop(dw_ref);
  CHECK_CUDA(cudaDeviceSynchronize());
  const Diff wgrad = compare(dw, dw_ref, size_t(E) * N * K);
  std::printf(
      "weight grad: max |grouped - cuBLAS| %.3g (max |ref| %.3g), non-finite %zu (an empty expert left "
      "unwritten shows here)\n",
      wgrad.err, wgrad.ref, wgrad.bad);
  const float twg = time_ms(run_wgrad), twl = time_ms([&]() { run_wloop(dw_ref); });
  std::printf("weight grad: grouped %.3f ms %.1f TFLOP/s | cuBLAS loop %.3f ms %.1f TFLOP/s | %.2fx\n", twg,
              flops / twg / 1e9, twl, flops / twl / 1e9, twl / twg);
  return fwd.bad || wgrad.bad ? 1 : 0;
}
