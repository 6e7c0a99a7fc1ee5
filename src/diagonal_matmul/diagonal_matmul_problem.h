// Internal description of one diagonal_matmul call, shared by the CUDA launchers and the float64
// reference. validate_diagonal_matmul() fills it from the public TensorViews; it is the only place that
// checks arguments (dtype, shape, strides, device, sizes), so every error message comes from one file.
//
// Every call is reduced to rows of b: row r (0 <= r < rows = B·M) scales by a[(r % a_rows) · a_stride]
// (a_rows = rows for a per-row a, M for a broadcast one).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/math.h"
#include "kernelforge/diagonal_matmul.h"

namespace kernelforge {

// Device-side parameters (passed by value to the kernels). Element (r, c) of a row tensor t is at
// t + r * t_stride + c (64-bit offsets).
struct DmParams {
  const void* a = nullptr;   // the scales
  const void* b = nullptr;   // forward: the matrix; backward: b (read for da only)
  void* y = nullptr;         // forward output; backward with db only: db (the forward on dy)
  const void* dy = nullptr;  // backward: gradient of y
  void* da = nullptr;        // backward: da (T), written directly when a is per row (or B == 1)
  float* da_rows = nullptr;  // backward, broadcast a over B != 1 batches: float32 row sums [B, M]
  void* db = nullptr;        // backward: gradient of b (nullptr: not written)
  int64_t rows = 0;          // rows of b: B · M
  int64_t n = 0;             // N, the row length
  int64_t a_rows = 0;        // rows of a: rows (per row) or M (broadcast)
  int64_t batches = 1;       // B (broadcast reduce: row sums per a row)
  int64_t a_stride = 0, da_stride = 0;
  int64_t b_stride = 0, y_stride = 0, dy_stride = 0, db_stride = 0;
  // whether the kernel triggers its dependents at once (set by the launcher: PDL on sm_90, whole grid
  // resident)
  bool trigger = false;

  // The a (and da) index of row r.
  KF_HOST_DEVICE int64_t a_row(int64_t r) const { return a_rows == rows ? r : r % a_rows; }
};

struct DmCall {
  const char* name = "";
  bool backward = false;
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  const TensorView* a = nullptr;
  const TensorView* b = nullptr;
  const TensorView* y = nullptr;   // forward
  const TensorView* dy = nullptr;  // backward
  const TensorView* da = nullptr;  // backward, optional
  const TensorView* db = nullptr;  // backward, optional
};

// Checks every argument of `c` and fills `p` (pointers, strides, sizes; da_rows stays null: the
// launcher points it into the workspace). `dtype` receives the dtype; `broadcast` whether a is [M]
// broadcast over B != 1 batches (the backward's da then needs the row-sum workspace).
Status validate_diagonal_matmul(const DmCall& c, DmParams* p, DType* dtype, bool* broadcast);

}  // namespace kernelforge
