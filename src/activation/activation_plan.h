// The activation planner: ActProblem -> ActPlan, pure host code over the small tables in
// activation_plan.cpp (no CUDA code: unit-tested on machines without a GPU).
//
// Every activation call is y = act(a) * b (or act(a)) over rows of n columns, forward or backward
// (activation_problem.h). Two kernels run them (kernels/act_fwd.cuh, kernels/act_bwd.cuh), each on a
// 2-D grid: block (tx, ty) = tx threads along a row, ty rows; grid (column chunks, row groups). A
// thread handles `vecs` vectors of `vec` elements of its row. The plan picks the vector width (the
// widest the alignment allows), the vectors per thread (a table per kernel and width) and the grid.
//
// gelu_backward_bias_grad runs a third kernel (kernels/act_bias_grad.cuh) and a reduction
// (kernels/act_bias_reduce.cuh): blocks of kActBiasTx x kActBiasTy threads own a column strip of
// kActBiasTx vectors and a chunk of rows; each thread sums its columns over the rows ty, ty + 8, ...
// of the chunk, `vecs` rows' vectors loaded before use. The row chunking is a function of (rows, n)
// only (never of the device or the vector width), so the workspace size is too, and so is the
// summation order: every plan and every GPU gives the same bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "activation/activation_problem.h"
#include "common/device.h"
#include "kernelforge/status.h"

namespace kernelforge {

constexpr int kActThreads = 256;     // threads per block (tx * ty), the kernels' __launch_bounds__
constexpr int kActMaxGridY = 65535;  // CUDA's limit for gridDim.y: more row groups loop over rows

// The bias-gradient column pass: 32 threads along the strip (512 contiguous bytes per row at 16-byte
// vectors), 8 row lanes; blocks for about kActBiasTargetBlocks counted on a nominal strip of
// kActBiasNominalTile columns (1024: ~8 blocks of 256 threads per SM on an H100), at most
// kActBiasMaxChunks row chunks (the partials: 128 x 4 bytes per column, L2-resident; 1 MB at
// N = 4096 against 402 MB of dy, x and dx at 16384 rows bf16) of at least kActBiasMinChunkRows rows
// (4 per row lane). The reduction: 32 columns x 8 chunk lanes per block.
constexpr int kActBiasTx = 32;
constexpr int kActBiasTy = 8;
constexpr int kActBiasTargetBlocks = 1024;
constexpr int kActBiasNominalTile = 256;
constexpr int kActBiasMaxChunks = 128;
constexpr int kActBiasMinChunkRows = 32;

enum class ActKernel : int {
  kFwd = 0,       // act_fwd: y = act(a) * b
  kBwd = 1,       // act_bwd: da = g * b * act'(a), db = g * act(a)
  kBiasGrad = 2,  // act_bias_grad + act_bias_reduce: da = g * gelu'(a), dbias = column sums of da
};

struct ActPlan {
  ActKernel kind = ActKernel::kFwd;
  int vec = 1;             // elements per vector (16 / 4 bytes or one element)
  int vecs = 1;            // vectors per thread per input, all loaded before the first use (kBiasGrad: rows)
  int tx = 32;             // threads along a row (a power of two, 32..256; kBiasGrad: kActBiasTx)
  int ty = 1;              // rows per block (kBiasGrad: kActBiasTy row lanes)
  int grid_x = 1;          // column chunks of tx * vecs vectors (kBiasGrad: strips of tx vectors)
  int grid_y = 1;          // row groups of ty rows (at most kActMaxGridY; more rows loop); kBiasGrad: row
                           // chunks (0 for no rows: the reduction alone writes dbias = 0)
  int64_t chunk_rows = 0;  // kBiasGrad: rows per chunk
};

// e.g. "act_fwd vec=8 vecs=1 block=128x2 grid=1x8192", "act_bias_grad vec=8 vecs=4 block=32x8 grid=16x64
// chunk=256"
std::string to_string(const ActPlan& plan);

struct ActProblem {
  bool backward = false;
  bool bias_grad = false;  // gelu_backward_bias_grad (backward too)
  int elem_bytes = 2;      // sizeof(T)
  int64_t rows = 0;
  int64_t n = 0;  // columns of y (I for the gated ops)
  // Widest access (bytes) every base pointer and (with more than one row) every row stride allows:
  // 16, 4 (16-bit types only) or elem_bytes.
  int align_bytes = 16;
};

// The problem of a validated call (pointers and strides of `p` give the alignment; p.dbias set: a
// bias-gradient call).
ActProblem make_act_problem(const ActParams& p, bool backward, int elem_bytes);

// Whether the problem launches nothing: rows == 0 or n == 0 (a bias gradient of no rows still writes
// dbias = 0: empty only for n == 0).
bool act_empty(const ActProblem& problem);

// The bias gradient's row chunks over `rows` rows of `n` columns and the rows per chunk (chunks = 0 for
// no rows), and its workspace: float32 partials [chunks, n].
void act_bias_chunking(int64_t rows, int64_t n, int* chunks, int64_t* chunk_rows);
int64_t act_bias_workspace_floats(int64_t rows, int64_t n);

// The plan production runs. Requires !act_empty(problem) (the entries launch nothing otherwise).
ActPlan plan_activation(const ActProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem: each vector width the alignment allows with each number of
// vectors per thread the kernels are built for (kActBuilds in activation_plan.cpp). Empty for an
// empty problem (act_empty).
std::vector<ActPlan> candidate_plans(const ActProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem` on `dev`; otherwise an error naming what does not fit.
Status check_plan(const ActPlan& plan, const ActProblem& problem, const DeviceInfo& dev);

// Test-only entries: run one call with a given plan (validate, check the device, check_plan, launch),
// and list a call's candidate plans on the current device.
Status launch_with_plan(const ActPlan& plan, const ActCall& call, cudaStream_t stream);
Status act_candidate_plans(const ActCall& call, std::vector<ActPlan>* plans);

// The launcher (activation_launch.cuh), one instantiation per dtype (activation_<dtype>.cu).
template <typename T>
Status launch_activation(const ActPlan& plan, ActFn fn, bool gated, const ActParams& p, const DeviceInfo& dev,
                         cudaStream_t stream);

}  // namespace kernelforge
