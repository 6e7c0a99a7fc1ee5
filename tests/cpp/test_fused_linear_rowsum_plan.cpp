// The fused_linear_rowsum planner (src/fused_linear_rowsum/fused_linear_rowsum_plan.h) without a GPU:
// problem -> the expected kernel sequence, width, grid and row chunks on the device facts of an H100,
// an A100 and a T4 (the same plan on each: the chunking, hence the summation order, is a function of
// the sizes only); the workspace covers every candidate; every candidate passes check_plan; impossible
// plans are rejected with a reason.
#include <string>
#include <vector>

#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kf::FlrsKernel;
using kf::FlrsPlan;
using kf::FlrsProblem;

const kf::DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};
const kf::DeviceInfo kA100 = {108, 80, 2048, 40 * 1024 * 1024};
const kf::DeviceInfo kT4 = {40, 75, 1024, 4 * 1024 * 1024};

FlrsProblem problem(FlrsKernel kind, int elem_bytes, int64_t T, int64_t K, int64_t O, int align = 16) {
  FlrsProblem p;
  p.kind = kind;
  p.elem_bytes = elem_bytes;
  p.tokens = T;
  p.k = K;
  p.o = O;
  p.align_bytes = align;
  return p;
}

TEST(FlrsPlan, ForwardBf16Training) {
  // 16384 x 4096 x 4096: W in 16 nominal tiles of 256 columns -> 64 chunks of 64 rows; x in 512 row_dot blocks
  const FlrsProblem pr = problem(FlrsKernel::kForward, 2, 16384, 4096, 4096);
  for (const kf::DeviceInfo* dev : {&kH100, &kA100, &kT4}) {
    const FlrsPlan p = kf::plan_fused_linear_rowsum(pr, *dev);
    EXPECT_EQ(kf::to_string(p), "flrs_fwd vec=8 cols=16 chunks=64x64 inflight=4 reduce=129 dot=512x4");
    EXPECT_TRUE(kf::check_plan(p, pr, *dev).ok());
  }
}

TEST(FlrsPlan, BackwardBf16Training) {
  // x [16384, 4096]: 64 chunks of 256 rows, 16 tiles -> 1024 blocks; dW [4096, 4096] in 64 row groups
  const FlrsProblem pr = problem(FlrsKernel::kBackward, 2, 16384, 4096, 4096);
  const FlrsPlan p = kf::plan_fused_linear_rowsum(pr, kH100);
  EXPECT_EQ(kf::to_string(p), "flrs_bwd vec=8 cols=16 chunks=64x256 inflight=4 reduce=129 bcast=64");
  EXPECT_EQ(p.grid_x * p.chunks, 1024);
}

TEST(FlrsPlan, Float32AndUnaligned) {
  const FlrsPlan f = kf::plan_fused_linear_rowsum(problem(FlrsKernel::kForward, 4, 65536, 2048, 2048), kH100);
  EXPECT_EQ(f.vec, 4);
  EXPECT_EQ(f.grid_x, 16);  // 2048 / (32 x 4)
  EXPECT_EQ(f.chunks, 64);  // 2048 rows of W: at least 32 per chunk
  const FlrsPlan u = kf::plan_fused_linear_rowsum(problem(FlrsKernel::kForward, 2, 4097, 1023, 513, 2), kH100);
  EXPECT_EQ(u.vec, 1);
  EXPECT_EQ(u.grid_x, 32);  // 1023 columns in tiles of 32
}

TEST(FlrsPlan, AccessWidthFromThePointers) {
  // rows at any alignment take 16-byte vectors (shifted loads); only a forward w_sum off a 16-byte
  // boundary forces one element
  alignas(16) static float ws[8];
  alignas(16) static uint16_t rows[64];
  kf::FlrsParams p;
  p.tokens = 4097, p.k = 1023, p.o = 513;
  p.x = rows + 1, p.x_stride = 1023;  // 2046-byte rows: every row at another alignment
  p.w = rows + 3, p.w_stride = 1025;
  p.w_sum = ws;
  EXPECT_EQ(kf::make_flrs_problem(p, false, 2).align_bytes, 16);
  EXPECT_EQ(kf::to_string(kf::plan_fused_linear_rowsum(kf::make_flrs_problem(p, false, 2), kH100)),
            "flrs_fwd vec=8 cols=4 chunks=17x31 inflight=4 reduce=32 dot=129x4");
  p.w_sum = ws + 1;
  EXPECT_EQ(kf::make_flrs_problem(p, false, 2).align_bytes, 2);
  EXPECT_EQ(kf::make_flrs_problem(p, false, 4).align_bytes, 4);
  p.dx = rows + 5, p.dx_stride = 1023;  // the backward reads w_sum one float at a time
  p.dw = rows + 1, p.dw_stride = 1023;
  EXPECT_EQ(kf::make_flrs_problem(p, true, 2).align_bytes, 16);
  EXPECT_EQ(kf::make_flrs_problem(p, true, 2).kind, FlrsKernel::kBackward);
}

TEST(FlrsPlan, Chunking) {
  int chunks = 0;
  int64_t rows = 0;
  kf::flrs_chunking(0, 4096, &chunks, &rows);  // no rows: one empty chunk
  EXPECT_EQ(chunks, 1);
  EXPECT_EQ(rows, 1);
  kf::flrs_chunking(1, 4096, &chunks, &rows);
  EXPECT_EQ(chunks, 1);
  kf::flrs_chunking(100, 64, &chunks, &rows);  // at least 32 rows per chunk
  EXPECT_EQ(chunks, 4);
  EXPECT_EQ(rows, 25);
  kf::flrs_chunking(1 << 20, 64, &chunks, &rows);  // at most 128 chunks
  EXPECT_EQ(chunks, 128);
  EXPECT_EQ(rows, 8192);
  kf::flrs_chunking(14336, 4096, &chunks, &rows);
  EXPECT_EQ(chunks, 64);
  EXPECT_EQ(rows, 224);
  for (int64_t r : {1, 31, 33, 4097, 100003})
    for (int64_t k : {0, 1, 255, 4096, 65537}) {
      kf::flrs_chunking(r, k, &chunks, &rows);
      EXPECT_GE(int64_t(chunks) * rows, r);
      EXPECT_LT(int64_t(chunks - 1) * rows, r);  // no empty chunk
      EXPECT_LE(chunks, kf::kFlrsMaxChunks);
    }
}

TEST(FlrsPlan, EmptySizes) {
  for (const FlrsProblem& pr :
       {problem(FlrsKernel::kForward, 2, 5, 0, 3), problem(FlrsKernel::kForward, 2, 4, 64, 0),
        problem(FlrsKernel::kBackward, 4, 0, 64, 8), problem(FlrsKernel::kBackward, 2, 5, 0, 3)}) {
    const FlrsPlan p = kf::plan_fused_linear_rowsum(pr, kH100);
    EXPECT_TRUE(kf::check_plan(p, pr, kH100).ok())
        << kf::to_string(p) << ": " << kf::check_plan(p, pr, kH100).message();
    EXPECT_GE(p.grid_x, 1);
    EXPECT_GE(p.reduce_blocks, 1);
  }
}

TEST(FlrsPlan, CandidatesFitTheWorkspace) {
  for (FlrsKernel kind : {FlrsKernel::kForward, FlrsKernel::kBackward, FlrsKernel::kBackwardDx})
    for (int align : {16, 2}) {
      const FlrsProblem pr = problem(kind, 2, 1100, 256, 4100, align);
      const std::vector<FlrsPlan> plans = kf::candidate_plans(pr, kH100);
      // per width: the built col_rows (x the built dot_rows, forward) at the planned chunks, and one chunk
      const size_t per_width = kind == FlrsKernel::kForward ? 5u : 3u;
      EXPECT_EQ(plans.size(), align == 16 ? 2 * per_width : per_width);
      for (const FlrsPlan& p : plans) {
        EXPECT_TRUE(kf::check_plan(p, pr, kH100).ok()) << kf::to_string(p);
        // partials of this plan + the reduced row fit the workspace of the sizes
        EXPECT_LE(kf::flrs_partial_floats(p.chunks, pr.k) + kf::flrs_partial_floats(1, pr.k),
                  kf::flrs_workspace_floats(pr.tokens, pr.k, pr.o));
      }
    }
}

TEST(FlrsPlan, WorkspaceSize) {
  // 16384 x 4096 x 4096: 64 chunks of 4097 floats (+ padding) and the reduced 4097 floats
  EXPECT_EQ(kf::fused_linear_rowsum_workspace_size(16384, 4096, 4096), size_t(4 * ((64 * 4097 + 3) / 4 * 4 + 4100)));
  EXPECT_EQ(kf::fused_linear_rowsum_workspace_size(0, 0, 0), size_t(4 * (4 + 4)));
  EXPECT_EQ(kf::fused_linear_rowsum_workspace_size(-1, 4, 4), 0u);
}

TEST(FlrsPlan, RejectsImpossiblePlans) {
  const FlrsProblem pr = problem(FlrsKernel::kForward, 2, 64, 1023, 64, 2);
  FlrsPlan p = kf::plan_fused_linear_rowsum(pr, kH100);
  FlrsPlan wide = p;
  wide.vec = 8;
  wide.grid_x = 4;
  EXPECT_NE(kf::check_plan(wide, pr, kH100).message().find("do not fit pointers and strides aligned to 2 bytes"),
            std::string::npos);
  FlrsPlan many = p;
  many.chunks = p.chunks + 1;
  EXPECT_NE(kf::check_plan(many, pr, kH100).message().find("workspace"), std::string::npos);
  FlrsPlan short_rows = p;
  short_rows.chunk_rows = 1;
  EXPECT_NE(kf::check_plan(short_rows, pr, kH100).message().find("do not cover the 64 rows"), std::string::npos);
  FlrsPlan cols = p;
  cols.grid_x = 1;
  EXPECT_NE(kf::check_plan(cols, pr, kH100).message().find("1023 columns"), std::string::npos);
  FlrsPlan inflight = p;
  inflight.col_rows = 3;
  EXPECT_NE(kf::check_plan(inflight, pr, kH100).message().find("not built for 3 rows in flight"), std::string::npos);
  FlrsPlan dot = p;
  dot.dot_rows = 3;
  EXPECT_NE(kf::check_plan(dot, pr, kH100).message().find("not built for 3 rows per warp"), std::string::npos);
  FlrsPlan other = p;
  other.kind = FlrsKernel::kBackward;
  EXPECT_FALSE(kf::check_plan(other, pr, kH100).ok());
}

}  // namespace
