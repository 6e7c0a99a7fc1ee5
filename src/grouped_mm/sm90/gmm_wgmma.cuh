// grouped_mm's sm_90a kernels: CUTLASS's grouped GEMM (TMA loads, wgmma, warp-specialized cooperative
// consumers, a persistent tile scheduler over every (group, output tile)), driven by a setup kernel
// that turns the offsets into CUTLASS's per-group shapes, pointers and strides on the device, so no
// group size reaches the host. Built only for sm_90a and only with CUTLASS's headers (pip
// nvidia-cutlass, found by CMake); included by one file per (dtype, op).
//
// CUTLASS computes D [M, N] = A [M, K] · B [K, N] per group (its B is "column-major" when K is
// contiguous). The three ops:
//   kRowsWRow  M = T_e, N = N, K = K: A = x_e row-major, B = w[e] with K contiguous, D = out rows
//   kRowsWCol  the same with w[e] N-contiguous (B row-major)
//   kWgrad     M = N, N = K, K = T_e: A = dy_eᵀ (M contiguous: column-major), B = x_e (N contiguous:
//              row-major), D = dw[e]; a group without rows has K = 0 and its D is written as 0
// Tile 128 x 256 x 64 with clusters of 2 along M (the B tile multicast to both CTAs): 751 TFLOP/s for
// 8 experts x 2048 tokens x 4096 -> 14336 on the H100 (the cuBLAS loop: 747), 456 against 253 for
// 64 experts x 256 tokens x 4096 -> 1536.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "grouped_mm/grouped_mm_problem.h"
#include "grouped_mm/kernels/gmm_groups.cuh"
#include "grouped_mm/kernels/gmm_tiles.h"

namespace kernelforge {
namespace gmm_wgmma {

using namespace cute;

template <typename T>
struct CutlassType;
template <>
struct CutlassType<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CutlassType<__half> {
  using type = cutlass::half_t;
};

constexpr int kTileM = kGmmWgmmaTileM, kTileN = kGmmWgmmaTileN, kTileK = kGmmWgmmaTileK, kClusterM = kGmmWgmmaClusterM;
constexpr int kAlign = 8;  // elements per 16 bytes: TMA's row alignment

template <typename T, GroupedMmOp kOp>
struct Config {
  using Elem = typename CutlassType<T>::type;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA =
      std::conditional_t<kOp == GroupedMmOp::kWgrad, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutB =
      std::conditional_t<kOp == GroupedMmOp::kRowsWRow, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, Int<kTileK>>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign, Elem, LayoutD*, kAlign,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Elem, float, void>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, LayoutA*, kAlign, Elem, LayoutB*, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
};

// A stride of CUTLASS's (outer, inner, batch) form with the one dynamic component set to `ld`.
template <class S>
__device__ __forceinline__ S ld_stride(int64_t ld) {
  S s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value)
    cute::get<1>(s) = ld;
  else
    cute::get<0>(s) = ld;
  return s;
}

// The per-group arrays in the workspace, each 256-byte aligned, then CUTLASS's own workspace.
template <typename T, GroupedMmOp kOp>
struct Arrays {
  using C = Config<T, kOp>;
  using Elem = typename C::Elem;
  typename C::Shape3* shapes;
  const Elem** pa;
  const Elem** pb;
  Elem** pd;
  typename C::StrideA* sa;
  typename C::StrideB* sb;
  typename C::StrideD* sd;
  void* cutlass_ws;

  static size_t align(size_t b) { return (b + 255) / 256 * 256; }
  static size_t bytes(int groups) {
    const size_t g = size_t(groups);
    return align(g * sizeof(typename C::Shape3)) + 3 * align(g * sizeof(void*)) +
           align(g * sizeof(typename C::StrideA)) + align(g * sizeof(typename C::StrideB)) +
           align(g * sizeof(typename C::StrideD));
  }
  static Arrays carve(void* ws, int groups) {
    const size_t g = size_t(groups);
    char* p = static_cast<char*>(ws);
    Arrays r;
    auto take = [&](size_t b) {
      char* q = p;
      p += align(b);
      return q;
    };
    r.shapes = reinterpret_cast<typename C::Shape3*>(take(g * sizeof(typename C::Shape3)));
    r.pa = reinterpret_cast<const Elem**>(take(g * sizeof(void*)));
    r.pb = reinterpret_cast<const Elem**>(take(g * sizeof(void*)));
    r.pd = reinterpret_cast<Elem**>(take(g * sizeof(void*)));
    r.sa = reinterpret_cast<typename C::StrideA*>(take(g * sizeof(typename C::StrideA)));
    r.sb = reinterpret_cast<typename C::StrideB*>(take(g * sizeof(typename C::StrideB)));
    r.sd = reinterpret_cast<typename C::StrideD*>(take(g * sizeof(typename C::StrideD)));
    r.cutlass_ws = p;
    return r;
  }
};

// Grid (any, 1), 256 threads. Block 0, warp w: groups w, w + 8, ... (each warp walks the offsets for
// its group's rows); every block then zeroes its share of the rows of no group (rows ops).
template <typename T, GroupedMmOp kOp>
__global__ void __launch_bounds__(256) gmm_wgmma_setup(const GmmParams p, const Arrays<T, kOp> arr) {
  pdl_wait();
  using C = Config<T, kOp>;
  using Elem = typename C::Elem;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const Elem* a = static_cast<const Elem*>(p.a);
  const Elem* b = static_cast<const Elem*>(p.b);
  Elem* out = static_cast<Elem*>(p.out);
  if (blockIdx.x == 0) {
    for (int e = warp; e < p.groups; e += blockDim.x / 32) {
      int64_t lo, hi;
      gmm_detail::group_rows(p.offsets, e, p.t, lane, &lo, &hi);
      if (lane != 0) continue;
      const int rows = int(hi - lo);
      if constexpr (kOp == GroupedMmOp::kWgrad) {
        arr.shapes[e] = typename C::Shape3(int(p.n), int(p.k), rows);
        arr.pa[e] = a + lo * p.a_ld;  // dy_e^T: column-major N x T_e, leading dimension dy's row stride
        arr.pb[e] = b + lo * p.b_sn;  // x_e: T_e x K with K contiguous
        arr.pd[e] = out + int64_t(e) * p.out_batch;
        arr.sa[e] = ld_stride<typename C::StrideA>(p.a_ld);
        arr.sb[e] = ld_stride<typename C::StrideB>(p.b_sn);
      } else {
        arr.shapes[e] = typename C::Shape3(rows, int(p.n), int(p.k));
        arr.pa[e] = a + lo * p.a_ld;
        arr.pb[e] = b + int64_t(e) * p.b_batch;
        arr.pd[e] = out + lo * p.out_ld;
        arr.sa[e] = ld_stride<typename C::StrideA>(p.a_ld);
        arr.sb[e] = ld_stride<typename C::StrideB>(kOp == GroupedMmOp::kRowsWRow ? p.b_sn : p.b_sk);
      }
      arr.sd[e] = ld_stride<typename C::StrideD>(p.out_ld);
    }
  }
  if constexpr (kOp != GroupedMmOp::kWgrad) {
    __shared__ int64_t s_end;
    if (warp == 0) {
      const int64_t end = gmm_detail::last_end(p.offsets, p.groups, p.t, lane);
      if (lane == 0) s_end = end;
    }
    __syncthreads();
    gmm_detail::fill_tail(out, p.out_ld, p.t, p.n, s_end);
  }
}

template <typename T, GroupedMmOp kOp>
typename Config<T, kOp>::Gemm::Arguments arguments(int groups, int sm_count, const Arrays<T, kOp>& arr) {
  using C = Config<T, kOp>;
  typename C::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {groups, arr.shapes, nullptr};  // shapes on the device only
  args.mainloop = {arr.pa, arr.sa, arr.pb, arr.sb};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = arr.pd;
  args.epilogue.dD = arr.sd;
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sm_count;
  return args;
}

}  // namespace gmm_wgmma

template <typename T, GroupedMmOp kOp>
size_t gmm_wgmma_workspace(int groups, int sm_count) {
  using namespace gmm_wgmma;
  Arrays<T, kOp> arr{};
  const size_t own = Arrays<T, kOp>::bytes(groups);
  return own + Config<T, kOp>::Gemm::get_workspace_size(arguments<T, kOp>(groups, sm_count, arr));
}

template <typename T, GroupedMmOp kOp>
Status gmm_wgmma_run(const GmmParams& p, int sm_count, void* workspace, cudaStream_t stream) {
  using namespace gmm_wgmma;
  using C = Config<T, kOp>;
  const Arrays<T, kOp> arr = Arrays<T, kOp>::carve(workspace, p.groups);
  typename C::Gemm::Arguments args = arguments<T, kOp>(p.groups, sm_count, arr);
  // The setup kernel: one block for the arrays; more to zero the rows of no group (rows ops), whose
  // count only the device knows: enough blocks to write a full output at a few waves.
  int blocks = 1;
  if (kOp != GroupedMmOp::kWgrad) {
    const int64_t elems = p.t * p.n;
    blocks = int(std::min<int64_t>(std::max<int64_t>(1, elems / (256 * 16)), int64_t(2) * sm_count));
  }
  Launch l(dim3(unsigned(blocks)), dim3(256), 0, stream, true);  // PDL: waits for the previous kernel
  Status s = launched(l(gmm_wgmma_setup<T, kOp>, p, arr), "grouped_mm setup");
  if (!s.ok()) return s;
  typename C::Gemm gemm;
  cutlass::Status cs = gemm.can_implement(args);
  if (cs != cutlass::Status::kSuccess)
    return Status::NotSupported(std::string("grouped_mm: CUTLASS cannot run this problem: ") +
                                cutlassGetStatusString(cs));
  cs = gemm.initialize(args, arr.cutlass_ws, stream);
  if (cs != cutlass::Status::kSuccess)
    return Status::Cuda(std::string("grouped_mm: CUTLASS initialize failed: ") + cutlassGetStatusString(cs));
  cs = gemm.run(stream);
  if (cs != cutlass::Status::kSuccess)
    return Status::Cuda(std::string("grouped_mm: CUTLASS run failed: ") + cutlassGetStatusString(cs));
  return check_launch("grouped_mm");
}

}  // namespace kernelforge
