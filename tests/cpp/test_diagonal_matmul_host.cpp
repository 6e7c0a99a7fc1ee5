// The diagonal_matmul family without a GPU: the float64 reference against hand-computed examples
// (DmReference), argument validation (DmValidation: the message names the function, the argument and
// what was expected; nothing is launched: the views point at a dummy address that is never
// dereferenced), and the planner on the device facts of an H100 (DmPlan: the expected plans from the
// launch rules, every candidate passes check_plan, impossible plans are rejected with a reason).
#include <string>
#include <vector>

#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;

constexpr DType F32 = DType::kFloat32;
constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F64 = DType::kFloat64;

HostTensor filled(DType t, std::vector<int64_t> shape, std::vector<double> v) {
  HostTensor h(t, std::move(shape));
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, v[size_t(i)]);
  return h;
}

// ---- reference -------------------------------------------------------------------------------

TEST(DmReference, ForwardPerRow) {
  const HostTensor a = filled(F64, {2}, {2.0, -0.5});
  const HostTensor b = filled(F64, {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor y(F64, {2, 3});
  KF_ASSERT_OK(ref::diagonal_matmul(a.view(), b.view(), y.view()));
  const double want[] = {2, 4, 6, -2, -2.5, -3};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y.get(i), want[i]) << i;
}

TEST(DmReference, ForwardBroadcastAndBatchedPerRow) {
  // b [2, 2, 2]; a [2] broadcast over the batch, and the same scales given per row ([2, 2]).
  const HostTensor b = filled(F64, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const HostTensor a = filled(F64, {2}, {10, -1});
  const HostTensor a_rows = filled(F64, {2, 2}, {10, -1, 10, -1});
  HostTensor y(F64, {2, 2, 2}), y2(F64, {2, 2, 2});
  KF_ASSERT_OK(ref::diagonal_matmul(a.view(), b.view(), y.view()));
  KF_ASSERT_OK(ref::diagonal_matmul(a_rows.view(), b.view(), y2.view()));
  const double want[] = {10, 20, -3, -4, 50, 60, -7, -8};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(y.get(i), want[i]) << i;
    EXPECT_EQ(y2.get(i), want[i]) << i;
  }
}

TEST(DmReference, Backward) {
  const HostTensor b = filled(F64, {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const HostTensor dy = filled(F64, {2, 2, 2}, {1, -1, 2, 0.5, 0, 3, -2, 1});
  const HostTensor a = filled(F64, {2}, {10, -1});
  const HostTensor a_rows = filled(F64, {2, 2}, {10, -1, 10, -1});
  // row dots: [1 - 2, 6 + 2, 0 + 18, -14 + 8] = [-1, 8, 18, -6]
  HostTensor da(F64, {2}), db(F64, {2, 2, 2}), da_rows(F64, {2, 2});
  const TensorView dav = da.view(), dbv = db.view(), darv = da_rows.view();
  KF_ASSERT_OK(ref::diagonal_matmul_backward(dy.view(), a.view(), b.view(), &dav, &dbv));
  EXPECT_EQ(da.get(0), -1.0 + 18.0);  // summed over the batch
  EXPECT_EQ(da.get(1), 8.0 - 6.0);
  const double want_db[] = {10, -10, -2, -0.5, 0, 30, 2, -1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(db.get(i), want_db[i]) << i;
  KF_ASSERT_OK(ref::diagonal_matmul_backward(dy.view(), a_rows.view(), b.view(), &darv, nullptr));
  const double want_da[] = {-1, 8, 18, -6};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(da_rows.get(i), want_da[i]) << i;
}

// The gradients are those of the forward: finite differences of L = Σ w · y in float64.
TEST(DmReference, FiniteDifferences) {
  Rng rng(11);
  HostTensor a = random_tensor(F64, {3}, rng), b = random_tensor(F64, {2, 3, 5}, rng);
  const HostTensor w = random_tensor(F64, {2, 3, 5}, rng);
  auto loss = [&]() {
    HostTensor y(F64, {2, 3, 5});
    EXPECT_TRUE(ref::diagonal_matmul(a.view(), b.view(), y.view()).ok());
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += w.get(i) * y.get(i);
    return l;
  };
  HostTensor da(F64, {3}), db(F64, {2, 3, 5});
  const TensorView dav = da.view(), dbv = db.view();
  KF_ASSERT_OK(ref::diagonal_matmul_backward(w.view(), a.view(), b.view(), &dav, &dbv));
  const double h = 1e-6;
  for (int64_t i = 0; i < 3; ++i) {
    const double v = a.get(i);
    a.set(i, v + h);
    const double up = loss();
    a.set(i, v - h);
    const double down = loss();
    a.set(i, v);
    EXPECT_NEAR(da.get(i), (up - down) / (2 * h), 1e-6) << "da " << i;
  }
  for (int64_t i = 0; i < b.numel(); i += 7) {
    const double v = b.get(i);
    b.set(i, v + h);
    const double up = loss();
    b.set(i, v - h);
    const double down = loss();
    b.set(i, v);
    EXPECT_NEAR(db.get(i), (up - down) / (2 * h), 1e-6) << "db " << i;
  }
}

TEST(DmReference, RoundsOnceToTheDtype) {
  // The exact product (1 + 2^-7)(1 - 2^-8) = 1 + 2^-8 - 2^-15 lies just below the midpoint of 1 and the
  // next bfloat16 (1 + 2^-7): rounded once from the exact value, it is 1.
  const HostTensor a = filled(BF16, {1}, {1.0 + 1.0 / 128});
  const HostTensor b = filled(BF16, {1, 1}, {1.0 - 1.0 / 256});
  HostTensor y(BF16, {1, 1});
  KF_ASSERT_OK(ref::diagonal_matmul(a.view(), b.view(), y.view()));
  EXPECT_EQ(y.get(0), 1.0);
}

TEST(DmReference, EmptyRowsGiveZeroDa) {
  const HostTensor a = filled(F32, {3}, {1, 2, 3});
  HostTensor b(F32, {3, 0}), dy(F32, {3, 0}), db(F32, {3, 0}), da(F32, {3});
  const TensorView dav = da.view(), dbv = db.view();
  KF_ASSERT_OK(ref::diagonal_matmul_backward(dy.view(), a.view(), b.view(), &dav, &dbv));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(da.get(i), 0.0);
  HostTensor b0(F32, {0, 3, 4}), dy0(F32, {0, 3, 4}), da0(F32, {3});  // broadcast over no batch
  const TensorView da0v = da0.view();
  KF_ASSERT_OK(ref::diagonal_matmul_backward(dy0.view(), a.view(), b0.view(), &da0v, nullptr));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(da0.get(i), 0.0);
}

// ---- validation ------------------------------------------------------------------------------

TEST(DmValidation, AShape) {
  const TensorView b = cuda_view(BF16, {2, 3, 8}), y = cuda_view(BF16, {2, 3, 8}, 0, uintptr_t{1} << 41);
  const TensorView a = cuda_view(BF16, {2, 4}, 0, uintptr_t{1} << 42);
  const Status st = kf::diagonal_matmul(a, b, y, nullptr);
  EXPECT_EQ(st.code(), kf::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "diagonal_matmul: a must have shape [2, 3] (b.shape[:-1]: one scale per row) or [3] ([M]: one scale per "
            "matrix row, broadcast over b's batch dimensions), got [2, 4]");
  const TensorView a8 = cuda_view(BF16, {8}, 0, uintptr_t{1} << 42);
  KF_EXPECT_INVALID(kf::diagonal_matmul(a8, b, y, nullptr), "a must have shape [2, 3]", "or [3]", "got [8]");
  HostTensor ha(F32, {5}), hb(F32, {4, 5}), hy(F32, {4, 5});
  KF_EXPECT_INVALID(ref::diagonal_matmul(ha.view(), hb.view(), hy.view()), "diagonal_matmul: a must have shape [4]",
                    "got [5]");
}

TEST(DmValidation, BRankAndLayout) {
  const TensorView b1 = cuda_view(F32, {8}), a = cuda_view(F32, {1}, 0, uintptr_t{1} << 42);
  KF_EXPECT_INVALID(kf::diagonal_matmul(a, b1, b1, nullptr),
                    "diagonal_matmul: b must have between 2 and 8 dimensions [..., M, N], got 1 dimensions [8]");
  TensorView b = cuda_view(F32, {4, 8}), y = cuda_view(F32, {4, 8}, 0, uintptr_t{1} << 41);
  const TensorView a4 = cuda_view(F32, {4}, 0, uintptr_t{1} << 42);
  b.strides[1] = 2, b.strides[0] = 16;
  KF_EXPECT_INVALID(kf::diagonal_matmul(a4, b, y, nullptr), "diagonal_matmul: b must be contiguous in its last",
                    "got stride 2");
  TensorView y_overlap = y;
  y_overlap.strides[0] = 4;
  KF_EXPECT_INVALID(kf::diagonal_matmul(a4, cuda_view(F32, {4, 8}), y_overlap, nullptr), "y rows overlap");
  TensorView a_bad = cuda_view(F32, {2, 3}, 0, uintptr_t{1} << 42);
  a_bad.strides[0] = 4;  // rows of a 4 apart, 3 long: no single stride
  const TensorView b3 = cuda_view(F32, {2, 3, 8}), y3 = cuda_view(F32, {2, 3, 8}, 0, uintptr_t{1} << 41);
  KF_EXPECT_INVALID(kf::diagonal_matmul(a_bad, b3, y3, nullptr),
                    "a must have dimensions that collapse into one stride");
}

TEST(DmValidation, DtypesAndDevices) {
  const TensorView b = cuda_view(F16, {4, 8}), y = cuda_view(F16, {4, 8}, 0, uintptr_t{1} << 41);
  KF_EXPECT_INVALID(kf::diagonal_matmul(cuda_view(F32, {4}, 0, uintptr_t{1} << 42), b, y, nullptr),
                    "diagonal_matmul: a must have the same dtype as b (float16), got float32");
  KF_EXPECT_INVALID(kf::diagonal_matmul(cuda_view(DType::kInt32, {4}), cuda_view(DType::kInt32, {4, 8}),
                                        cuda_view(DType::kInt32, {4, 8}), nullptr),
                    "diagonal_matmul: b must be a float32/float16/bfloat16 tensor, got int32");
  KF_EXPECT_INVALID(kf::diagonal_matmul(cuda_view(F16, {4}, 1), b, y, nullptr),
                    "a must be on the same device as b (cuda:0), got cuda:1");
  HostTensor ha(F16, {4}), hb(F16, {4, 8}), hy(F16, {4, 8});
  KF_EXPECT_INVALID(kf::diagonal_matmul(ha.view(), hb.view(), hy.view(), nullptr),
                    "diagonal_matmul: b must be a CUDA tensor, got cpu");
  KF_EXPECT_INVALID(ref::diagonal_matmul(cuda_view(F16, {4}), b, y), "b must be a CPU tensor for the reference");
}

TEST(DmValidation, BackwardArguments) {
  const TensorView b = cuda_view(BF16, {2, 3, 8}), dy = cuda_view(BF16, {2, 3, 8}, 0, uintptr_t{1} << 41);
  const TensorView a = cuda_view(BF16, {3}, 0, uintptr_t{1} << 42),
                   db = cuda_view(BF16, {2, 3, 8}, 0, uintptr_t{1} << 43);
  const TensorView da_bad = cuda_view(BF16, {2, 3}, 0, uintptr_t{1} << 44);
  size_t bytes = 0;
  KF_EXPECT_INVALID(kf::diagonal_matmul_backward(dy, a, b, nullptr, nullptr, nullptr, &bytes, nullptr),
                    "diagonal_matmul_backward: at least one of da and db must be given");
  KF_EXPECT_INVALID(kf::diagonal_matmul_backward(dy, a, b, &da_bad, &db, nullptr, &bytes, nullptr),
                    "diagonal_matmul_backward: da must have shape [3] (the shape of a), got [2, 3]");
  const TensorView dy_bad = cuda_view(BF16, {2, 3, 9}, 0, uintptr_t{1} << 41);
  KF_EXPECT_INVALID(kf::diagonal_matmul_backward(dy_bad, a, b, nullptr, &db, nullptr, &bytes, nullptr),
                    "dy must have shape [2, 3, 8] (the shape of b), got [2, 3, 9]");
  KF_EXPECT_INVALID(kf::diagonal_matmul_backward(dy, a, b, nullptr, &db, nullptr, nullptr, nullptr),
                    "workspace_bytes must not be null");
  TensorView da_zero = cuda_view(BF16, {3}, 0, uintptr_t{1} << 44);
  da_zero.strides[0] = 0;
  KF_EXPECT_INVALID(kf::diagonal_matmul_backward(dy, a, b, &da_zero, nullptr, nullptr, &bytes, nullptr),
                    "da elements overlap (stride 0)");
}

// The size query needs no GPU: it returns before the device check. A broadcast a with da needs
// 4 · B · M bytes; everything else none.
TEST(DmValidation, WorkspaceSize) {
  const TensorView b = cuda_view(F32, {4, 3, 8}), dy = cuda_view(F32, {4, 3, 8}, 0, uintptr_t{1} << 41);
  const TensorView a = cuda_view(F32, {3}, 0, uintptr_t{1} << 42), da = cuda_view(F32, {3}, 0, uintptr_t{1} << 43);
  const TensorView a_rows = cuda_view(F32, {4, 3}, 0, uintptr_t{1} << 42);
  const TensorView da_rows = cuda_view(F32, {4, 3}, 0, uintptr_t{1} << 43);
  const TensorView db = cuda_view(F32, {4, 3, 8}, 0, uintptr_t{1} << 44);
  size_t bytes = 1;
  KF_ASSERT_OK(kf::diagonal_matmul_backward(dy, a, b, &da, &db, nullptr, &bytes, nullptr));
  EXPECT_EQ(bytes, size_t(4 * 3 * 4));
  KF_ASSERT_OK(kf::diagonal_matmul_backward(dy, a, b, nullptr, &db, nullptr, &bytes, nullptr));
  EXPECT_EQ(bytes, size_t(0));
  KF_ASSERT_OK(kf::diagonal_matmul_backward(dy, a_rows, b, &da_rows, &db, nullptr, &bytes, nullptr));
  EXPECT_EQ(bytes, size_t(0));
  size_t small = 8;
  KF_EXPECT_INVALID(
      kf::diagonal_matmul_backward(dy, a, b, &da, &db, reinterpret_cast<void*>(uintptr_t{1} << 45), &small, nullptr),
      "the workspace must hold 48 bytes", "got 8");
}

// ---- plan --------------------------------------------------------------------------------------
const kf::DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};

kf::DmProblem problem(bool backward, int elem_bytes, int64_t rows, int64_t n, int align = 16, bool db = true,
                      bool reduce = false, int64_t a_rows = -1) {
  kf::DmProblem p;
  p.backward = backward;
  p.db = backward && db;
  p.reduce = backward && reduce;
  p.elem_bytes = elem_bytes;
  p.rows = rows;
  p.n = n;
  p.a_rows = a_rows < 0 ? rows : a_rows;
  p.align_bytes = align;
  return p;
}

struct Expect {
  const char* what;
  kf::DmProblem problem;
  const char* plan;
};

// From the launch rules: 16-byte vectors when the tensors share their alignment (forward 1 per
// thread, backward 2; narrower accesses 4), tx = the power of two covering a row's vectors in `vecs`
// passes (1..256), ty filling the block to 256 threads (at least a warp, no more rows than there are).
const Expect kExpect[] = {
    {"fwd 16384x4096 bf16", problem(false, 2, 16384, 4096), "dm_fwd vec=8 vecs=2 block=256x1 grid=1x16384"},
    {"fwd 4096x4096 fp32", problem(false, 4, 4096, 4096), "dm_fwd vec=4 vecs=2 block=256x1 grid=2x4096"},
    {"fwd 4097x1023 bf16 (head)", problem(false, 2, 4097, 1023), "dm_fwd vec=8 vecs=2 block=64x4 grid=1x1025"},
    {"fwd 100000x64 bf16", problem(false, 2, 100000, 64), "dm_fwd vec=8 vecs=2 block=4x64 grid=1x1563"},
    {"fwd 7x1 fp16", problem(false, 2, 7, 1), "dm_fwd vec=8 vecs=2 block=1x32 grid=1x1"},
    {"fwd rows past 65535 groups", problem(false, 2, 1 << 24, 4096), "dm_fwd vec=8 vecs=2 block=256x1 grid=1x65535"},
    {"fwd mixed alignment bf16", problem(false, 2, 64, 4096, 4), "dm_fwd vec=2 vecs=4 block=256x1 grid=2x64"},
    {"fwd one-element fp16", problem(false, 2, 64, 4096, 2), "dm_fwd vec=1 vecs=4 block=256x1 grid=4x64"},
    {"bwd 16384x4096 bf16", problem(true, 2, 16384, 4096), "dm_bwd vec=8 vecs=4 block=128x2 grid=8192 db"},
    {"bwd da only", problem(true, 2, 16384, 4096, 16, false), "dm_bwd vec=8 vecs=4 block=128x2 grid=8192"},
    {"bwd 8x2048x2048 bcast", problem(true, 2, 16384, 2048, 16, true, true, 2048),
     "dm_bwd vec=8 vecs=4 block=64x4 grid=4096 db + dm_reduce grid=256"},
    {"bwd 100000x64 bf16", problem(true, 2, 100000, 64), "dm_bwd vec=8 vecs=4 block=2x128 grid=782 db"},
    {"bwd n = 0", problem(true, 4, 5, 0), "dm_bwd vec=4 vecs=4 block=1x32 grid=1 db"},
    {"bwd no batches, bcast", problem(true, 2, 0, 8, 16, false, true, 3),
     "dm_bwd vec=8 vecs=4 block=1x32 grid=0 + dm_reduce grid=1"},
};

TEST(DmPlan, ExpectedPlans) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const kf::DmPlan plan = kf::plan_diagonal_matmul(e.problem, kH100);
    EXPECT_EQ(kf::to_string(plan), e.plan);
    KF_ASSERT_OK(kf::check_plan(plan, e.problem, kH100));
  }
}

TEST(DmPlan, EveryCandidatePasses) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const std::vector<kf::DmPlan> plans = kf::candidate_plans(e.problem, kH100);
    ASSERT_FALSE(plans.empty());
    for (const kf::DmPlan& p : plans) {
      const Status st = kf::check_plan(p, e.problem, kH100);
      EXPECT_TRUE(st.ok()) << kf::to_string(p) << ": " << st.message();
    }
  }
}

TEST(DmPlan, RejectsImpossiblePlans) {
  const kf::DmProblem fwd = problem(false, 2, 64, 1023, 4);
  kf::DmPlan p = kf::plan_diagonal_matmul(fwd, kH100);
  EXPECT_EQ(p.vec, 2);
  kf::DmPlan wide = p;
  wide.vec = 8, wide.vecs = 1;
  KF_EXPECT_INVALID(kf::check_plan(wide, fwd, kH100), "vectors of 16 bytes do not fit");
  kf::DmPlan small = p;
  small.grid_x = 0;
  KF_EXPECT_INVALID(kf::check_plan(small, fwd, kH100), "the grid does not cover");
  kf::DmPlan odd = p;
  odd.tx = 48;
  KF_EXPECT_INVALID(kf::check_plan(odd, fwd, kH100), "tx must be a power of two");
  kf::DmPlan partial_warp = p;
  partial_warp.tx = 8, partial_warp.ty = 2;
  KF_EXPECT_INVALID(kf::check_plan(partial_warp, fwd, kH100), "a multiple of 32 threads");
  const kf::DmProblem bwd = problem(true, 2, 64, 1024, 16, true, true, 8);
  kf::DmPlan no_reduce = kf::plan_diagonal_matmul(bwd, kH100);
  no_reduce.reduce_grid = 0;
  KF_EXPECT_INVALID(kf::check_plan(no_reduce, bwd, kH100), "a broadcast a needs dm_reduce");
  KF_EXPECT_INVALID(kf::check_plan(p, bwd, kH100), "the problem is a dm_bwd call");
  KF_EXPECT_INVALID(kf::check_plan(p, problem(false, 2, 0, 1023), kH100), "nothing to launch");
}

// make_dm_problem: the width at which every row tensor shares the lead tensor's misalignment.
TEST(DmPlan, SharedMisalignment) {
  alignas(16) static unsigned char buf[1 << 12];
  kf::DmParams p;
  p.rows = 4, p.n = 1023, p.a_rows = 4;
  p.b = buf + 2, p.y = buf + 2 + 2048;  // both one bf16 element off a 16-byte boundary
  p.b_stride = 1023, p.y_stride = 1023;
  EXPECT_EQ(kf::make_dm_problem(p, false, 2).align_bytes, 16);
  p.y_stride = 1024;  // rows drift apart by 2 bytes per row
  EXPECT_EQ(kf::make_dm_problem(p, false, 2).align_bytes, 2);
  p.y_stride = 1025;  // 4 bytes per row
  EXPECT_EQ(kf::make_dm_problem(p, false, 2).align_bytes, 4);
  p.rows = 1;  // one row: strides do not matter
  EXPECT_EQ(kf::make_dm_problem(p, false, 2).align_bytes, 16);
}

}  // namespace
