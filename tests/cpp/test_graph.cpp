// The CUDA graph kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case (dtype x index dtype x shape x layout x reduce) runs five calls, each with every
// candidate plan of the planner (16-byte and one-element vectors, the production tile and tiles of
// 4 and 32 positions, so that long segments cross many tiles and go through seg_combine):
//   segment form     gather_reduce(x [nnz, F], rowptr)                      -> out, argmax
//   segment backward segment_reduce_backward(dout, rowptr, argmax)          -> dx [nnz, F]
//   gather form      gather_reduce(x [X, F], rowptr, col, eid, weight)      -> out, argmax (gather_scatter)
//   gather backward  gather_reduce over the transposed CSR (scale_rowptr / mask_arg) -> dx [X, F]
//   edge weights     edge_weight_grad(dout, x, src, dst, rowptr, argmax)    -> dw [E]
// on fresh random inputs, with outputs poisoned (NaN; argmax 0x7F7F7F7F) and the workspace poisoned
// (NaN) before each run. Values are compared with the one tolerance table per dtype (atol scaled by
// the square root of the longest segment), argmax exactly; NaN never passes; bytes outside each output
// view must stay untouched. Every call also runs twice with the production plan: the results must be
// bit-identical (no atomics). Graphs have power-law degrees, empty segments and one long segment.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "graph/graph_plan.h"
#include "test_graph_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kf::GraphReduce;

struct Shape {
  int64_t n;      // segments (destination nodes)
  int64_t x;      // source nodes of the gather form
  int64_t nnz;    // positions (edges)
  int64_t f;      // features
  int64_t long_;  // positions of the one long segment
};
const Shape kShapes[] = {{1, 1, 1, 1, 0},          {7, 5, 40, 7, 0},           {3, 11, 0, 8, 0},
                         {50, 37, 3001, 33, 2000}, {200, 64, 5000, 128, 3000}, {17, 9, 300, 1024, 0},
                         {0, 5, 0, 8, 0},          {64, 100, 700, 64, 0},      {5, 3, 1000, 1, 900}};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "n" << s.n << "x" << s.x << "e" << s.nnz << "f" << s.f << "l" << s.long_;
}

Layout layout_of(LayoutKind l) {
  switch (l) {
    case LayoutKind::kRowPadded:
      return {8, 0};
    case LayoutKind::kOddStride:
      return {3, 0};
    case LayoutKind::kUnaligned:
      return {0, 1};
    default:
      return {0, 0};
  }
}

const char* reduce_name(GraphReduce r) {
  return r == GraphReduce::kSum ? "sum" : r == GraphReduce::kMean ? "mean" : "max";
}

using Case = std::tuple<DType, DType, Shape, LayoutKind, GraphReduce>;

DeviceTensor to_device(const HostTensor& h, Layout l = {}) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

class GraphGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    const DType t = std::get<0>(GetParam());
    if (t == DType::kBFloat16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    if (ws_) cudaFree(ws_);
  }

  // A workspace of `bytes`, filled with 0xFF (NaN partials) before each run.
  void* workspace(size_t bytes) {
    if (bytes > ws_bytes_) {
      if (ws_) cudaFree(ws_);
      ws_ = nullptr;
      EXPECT_EQ(cudaMalloc(&ws_, bytes), cudaSuccess);
      ws_bytes_ = bytes;
    }
    if (ws_) cudaMemset(ws_, 0xFF, ws_bytes_);
    cudaDeviceSynchronize();
    return ws_;
  }

  // Runs `call` with every candidate plan (and the production entry twice, for determinism): `reset`
  // poisons the outputs, `check` compares them with the reference; `snapshot` downloads the outputs.
  template <typename Reset, typename Check, typename Snapshot, typename Entry>
  void all_plans(const kf::GraphCall& call, const std::string& what, Reset reset, Check check, Snapshot snapshot,
                 Entry entry) {
    std::vector<kf::GraphPlan> plans;
    KF_ASSERT_OK(kf::graph_candidate_plans(call, &plans));
    size_t ws = 0;
    const bool max = call.op == kf::GraphOp::kGatherReduce && call.gr->reduce == GraphReduce::kMax;
    for (const kf::GraphPlan& p : plans)
      ws = std::max(ws,
                    kf::graph_workspace_bytes(p.tile_rows,
                                              call.op == kf::GraphOp::kGatherReduce
                                                  ? (call.gr->col ? call.gr->col->shape[0] : call.gr->x->shape[0])
                                                  : 0,
                                              call.op == kf::GraphOp::kGatherReduce ? call.gr->x->shape[1] : 0, max));
    for (const kf::GraphPlan& p : plans) {
      reset();
      void* w = workspace(ws);
      KF_ASSERT_OK(kf::launch_with_plan(p, call, w, ws, stream_));
      KF_CUDA_CHECK(cudaStreamSynchronize(stream_));
      SCOPED_TRACE(what + " plan " + kf::to_string(p));
      check();
    }
    // production entry, twice: bit-identical
    reset();
    KF_ASSERT_OK(entry(workspace(ws)));
    KF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    {
      SCOPED_TRACE(what + " production entry");
      check();
    }
    const std::vector<HostTensor> first = snapshot();
    reset();
    KF_ASSERT_OK(entry(workspace(ws)));
    KF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<HostTensor> second = snapshot();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(bit_equal((what + " rerun").c_str(), first[i], second[i]));
  }

  cudaStream_t stream_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
};

void poison_arg(DeviceTensor& a) {
  a.poison();
  if (a.view().numel() > 0) cudaMemset(a.view().data, 0x7F, size_t(a.view().numel()) * 4);
  cudaDeviceSynchronize();
}

::testing::AssertionResult same_ints(const char* what, const HostTensor& got, const HostTensor& want) {
  for (int64_t i = 0; i < got.numel(); ++i)
    if (got.get(i) != want.get(i))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << got.get(i) << ", expected " << want.get(i);
  return ::testing::AssertionSuccess();
}

int64_t longest(const std::vector<int64_t>& rowptr) {
  int64_t m = 1;
  for (size_t v = 0; v + 1 < rowptr.size(); ++v) m = std::max(m, rowptr[v + 1] - rowptr[v]);
  return m;
}

TEST_P(GraphGpu, MatchesReference) {
  const auto [t, it, shape, lk, reduce] = GetParam();
  const bool max = reduce == GraphReduce::kMax;
  const Layout lay = layout_of(lk);
  Rng rng(hash_str(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  const int64_t N = shape.n, X = shape.x, E = shape.nnz, F = shape.f;
  if (N == 0 && E > 0) GTEST_SKIP();
  // values up to 2 in magnitude times weights up to 2: sums of up to `deg` terms of 4
  auto tol_for = [&](int64_t terms) {
    Tol tol = reduction_tolerance(t, terms);
    tol.atol *= 4;
    return tol;
  };

  // ---- segment form ----------------------------------------------------------------------------
  {
    const std::vector<int64_t> rows = rowptr_of(skewed_targets(std::max<int64_t>(N, 1), E, shape.long_, rng), N);
    HostTensor x = random_tensor(t, {E, F}, rng), rp = index_tensor(it, rows);
    HostTensor want(t, {N, F}), want_arg(DType::kInt32, {N, F});
    const kf::TensorView hx = x.view(), hr = rp.view(), ho = want.view(), ha = want_arg.view();
    kf::GatherReduceArgs ra;
    ra.x = &hx, ra.rowptr = &hr, ra.out = &ho, ra.reduce = reduce;
    if (max) ra.argmax = &ha;
    KF_ASSERT_OK(ref::gather_reduce(ra));

    DeviceTensor dx_in = to_device(x, lay), drp = to_device(rp), dout(t, {N, F}, lay), darg(DType::kInt32, {N, F});
    const kf::TensorView vx = dx_in.view(), vr = drp.view(), vo = dout.view(), va = darg.view();
    kf::GatherReduceArgs a;
    a.name = "segment_reduce";
    a.x = &vx, a.rowptr = &vr, a.out = &vo, a.reduce = reduce;
    if (max) a.argmax = &va;
    kf::GraphCall call;
    call.op = kf::GraphOp::kGatherReduce, call.name = a.name, call.gr = &a;
    const Tol tol = tol_for(longest(rows));
    all_plans(
        call, std::string("segment ") + reduce_name(reduce), [&] { dout.poison(), poison_arg(darg); },
        [&] {
          EXPECT_TRUE(all_close("out", dout.download(), want, tol));
          EXPECT_TRUE(dout.check_untouched("out"));
          if (max) {
            EXPECT_TRUE(same_ints("argmax", darg.download(), want_arg));
          }
        },
        [&] {
          return std::vector<HostTensor>{dout.download(), darg.download()};
        },
        [&](void* w) { return kf::gather_reduce(a, w, kf::gather_reduce_workspace_bytes(E, F, reduce), stream_); });

    // ---- segment backward ----------------------------------------------------------------------
    HostTensor g = random_tensor(t, {N, F}, rng), want_dx(t, {E, F});
    const kf::TensorView hg = g.view(), hdx = want_dx.view();
    KF_ASSERT_OK(ref::segment_reduce_backward("t", hg, hr, reduce, max ? &ha : nullptr, hdx));
    DeviceTensor dg = to_device(g, lay), ddx(t, {E, F}, lay), dargs = to_device(want_arg);
    const kf::TensorView vg = dg.view(), vdx = ddx.view(), vas = dargs.view();
    kf::GraphCall bc;
    bc.op = kf::GraphOp::kExpand, bc.name = "segment_reduce_backward", bc.dout = &vg, bc.rowptr = &vr;
    bc.reduce = reduce, bc.argmax = max ? &vas : nullptr, bc.result = &vdx;
    if (E > 0 && F > 0)
      all_plans(
          bc, std::string("segment backward ") + reduce_name(reduce), [&] { ddx.poison(); },
          [&] {
            EXPECT_TRUE(all_close("dx", ddx.download(), want_dx, tolerance(t)));
            EXPECT_TRUE(ddx.check_untouched("dx"));
          },
          [&] { return std::vector<HostTensor>{ddx.download()}; },
          [&](void*) {
            return kf::segment_reduce_backward("segment_reduce_backward", vg, vr, reduce, max ? &vas : nullptr, vdx,
                                               stream_);
          });
  }

  // ---- gather form (gather_scatter) --------------------------------------------------------------
  if (N > 0) {
    const EdgeGraph gr = make_edges(N, X, E, shape.long_, rng);
    HostTensor x = random_tensor(t, {X, F}, rng), w = pow2_weights(t, E, rng);
    HostTensor rp = index_tensor(it, gr.rowptr), col = index_tensor(it, gr.col), eid = index_tensor(it, gr.eid);
    HostTensor want(t, {N, F}), want_arg(DType::kInt32, {N, F});
    const kf::TensorView hx = x.view(), hw = w.view(), hr = rp.view(), hc = col.view(), he = eid.view();
    const kf::TensorView ho = want.view(), ha = want_arg.view();
    kf::GatherReduceArgs ra;
    ra.x = &hx, ra.rowptr = &hr, ra.col = &hc, ra.eid = &he, ra.weight = &hw, ra.out = &ho, ra.reduce = reduce;
    if (max) ra.argmax = &ha;
    KF_ASSERT_OK(ref::gather_reduce(ra));

    DeviceTensor dx_in = to_device(x, lay), dw_in = to_device(w), drp = to_device(rp), dcol = to_device(col);
    DeviceTensor deid = to_device(eid), dout(t, {N, F}, lay), darg(DType::kInt32, {N, F});
    const kf::TensorView vx = dx_in.view(), vw = dw_in.view(), vr = drp.view(), vc = dcol.view(), ve = deid.view();
    const kf::TensorView vo = dout.view(), va = darg.view();
    kf::GatherReduceArgs a;
    a.name = "gather_scatter";
    a.x = &vx, a.rowptr = &vr, a.col = &vc, a.eid = &ve, a.weight = &vw, a.out = &vo, a.reduce = reduce;
    if (max) a.argmax = &va;
    kf::GraphCall call;
    call.op = kf::GraphOp::kGatherReduce, call.name = a.name, call.gr = &a;
    const Tol tol = tol_for(longest(gr.rowptr));
    all_plans(
        call, std::string("gather ") + reduce_name(reduce), [&] { dout.poison(), poison_arg(darg); },
        [&] {
          EXPECT_TRUE(all_close("out", dout.download(), want, tol));
          EXPECT_TRUE(dout.check_untouched("out"));
          if (max) {
            EXPECT_TRUE(same_ints("argmax", darg.download(), want_arg));
          }
        },
        [&] {
          return std::vector<HostTensor>{dout.download(), darg.download()};
        },
        [&](void* wsp) { return kf::gather_reduce(a, wsp, kf::gather_reduce_workspace_bytes(E, F, reduce), stream_); });

    // ---- gather backward: dx over the transposed CSR -------------------------------------------
    HostTensor g = random_tensor(t, {N, F}, rng), want_dx(t, {X, F});
    HostTensor rpt = index_tensor(it, gr.rowptr_t), colt = index_tensor(it, gr.col_t),
               eidt = index_tensor(it, gr.eid_t);
    const kf::TensorView hg = g.view(), hrt = rpt.view(), hct = colt.view(), het = eidt.view(), hdx = want_dx.view();
    kf::GatherReduceArgs rb;
    rb.x = &hg, rb.rowptr = &hrt, rb.col = &hct, rb.eid = &het, rb.weight = &hw, rb.out = &hdx;
    if (reduce == GraphReduce::kMean) rb.scale_rowptr = &hr;
    if (max) rb.mask_arg = &ha;
    KF_ASSERT_OK(ref::gather_reduce(rb));
    DeviceTensor dg = to_device(g, lay), drpt = to_device(rpt), dcolt = to_device(colt), deidt = to_device(eidt);
    DeviceTensor ddx(t, {X, F}, lay), dmask = to_device(want_arg);
    const kf::TensorView vg = dg.view(), vrt = drpt.view(), vct = dcolt.view(), vet = deidt.view();
    const kf::TensorView vdx = ddx.view(), vm = dmask.view();
    kf::GatherReduceArgs b;
    b.name = "gather_scatter_backward";
    b.x = &vg, b.rowptr = &vrt, b.col = &vct, b.eid = &vet, b.weight = &vw, b.out = &vdx;
    if (reduce == GraphReduce::kMean) b.scale_rowptr = &vr;
    if (max) b.mask_arg = &vm;
    kf::GraphCall bcall;
    bcall.op = kf::GraphOp::kGatherReduce, bcall.name = b.name, bcall.gr = &b;
    const Tol btol = tol_for(longest(gr.rowptr_t));
    all_plans(
        bcall, std::string("gather backward dx ") + reduce_name(reduce), [&] { ddx.poison(); },
        [&] {
          EXPECT_TRUE(all_close("dx", ddx.download(), want_dx, btol));
          EXPECT_TRUE(ddx.check_untouched("dx"));
        },
        [&] { return std::vector<HostTensor>{ddx.download()}; },
        [&](void* wsp) {
          return kf::gather_reduce(b, wsp, kf::gather_reduce_workspace_bytes(E, F, GraphReduce::kSum), stream_);
        });

    // ---- edge-weight gradient --------------------------------------------------------------------
    HostTensor src = index_tensor(it, gr.src), dst = index_tensor(it, gr.dst), want_dw(t, {E});
    const kf::TensorView hs = src.view(), hd = dst.view(), hdw = want_dw.view();
    KF_ASSERT_OK(ref::edge_weight_grad("t", hg, hx, hs, hd, hr, reduce, max ? &ha : nullptr, hdw));
    DeviceTensor dsrc = to_device(src), ddst = to_device(dst), ddw(t, {E});
    const kf::TensorView vs = dsrc.view(), vd = ddst.view(), vdw = ddw.view();
    kf::GraphCall ec;
    ec.op = kf::GraphOp::kEdgeDot, ec.name = "edge_weight_grad", ec.dout = &vg, ec.x = &vx, ec.src = &vs;
    ec.dst = &vd, ec.rowptr = &vr, ec.reduce = reduce, ec.argmax = max ? &vm : nullptr, ec.result = &vdw;
    if (E > 0 && F > 0)
      all_plans(
          ec, std::string("edge weights ") + reduce_name(reduce), [&] { ddw.poison(); },
          [&] {
            EXPECT_TRUE(all_close("dw", ddw.download(), want_dw, tol_for(F)));
            EXPECT_TRUE(ddw.check_untouched("dw"));
          },
          [&] { return std::vector<HostTensor>{ddw.download()}; },
          [&](void*) {
            return kf::edge_weight_grad("edge_weight_grad", vg, vx, vs, vd, vr, reduce, max ? &vm : nullptr, vdw,
                                        stream_);
          });
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, GraphGpu,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(DType::kInt64, DType::kInt32), ::testing::ValuesIn(kShapes),
                       ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded, LayoutKind::kOddStride,
                                         LayoutKind::kUnaligned),
                       ::testing::Values(GraphReduce::kSum, GraphReduce::kMean, GraphReduce::kMax)));

// A bad source index reads nothing and makes its segment NaN (never a silent wrong value).
TEST(GraphGpuSpecial, OutOfRangeColumnGivesNaN) {
  KF_NEED_GPU();
  Rng rng(7);
  HostTensor x = random_tensor(DType::kFloat32, {4, 8}, rng);
  HostTensor rp = index_tensor(DType::kInt64, {0, 2, 3}), col = index_tensor(DType::kInt64, {1, 9, 2});
  DeviceTensor dx = to_device(x), drp = to_device(rp), dcol = to_device(col), dout(DType::kFloat32, {2, 8});
  const kf::TensorView vx = dx.view(), vr = drp.view(), vc = dcol.view(), vo = dout.view();
  kf::GatherReduceArgs a;
  a.x = &vx, a.rowptr = &vr, a.col = &vc, a.out = &vo;
  const size_t ws = kf::gather_reduce_workspace_bytes(3, 8, GraphReduce::kSum);
  void* w = nullptr;
  if (ws) {
    ASSERT_EQ(cudaMalloc(&w, ws), cudaSuccess);
  }
  KF_ASSERT_OK(kf::gather_reduce(a, w, ws, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  const HostTensor got = dout.download();
  for (int64_t f = 0; f < 8; ++f) {
    EXPECT_TRUE(std::isnan(got.get(f))) << f;
    EXPECT_EQ(got.get(8 + f), x.get(2 * 8 + f)) << f;
  }
  if (w) cudaFree(w);
}

TEST(GraphGpuSpecial, WorkspaceTooSmall) {
  KF_NEED_GPU();
  DeviceTensor dx(DType::kFloat32, {100, 8}), drp = to_device(index_tensor(DType::kInt64, {0, 100}));
  DeviceTensor dout(DType::kFloat32, {1, 8});
  const kf::TensorView vx = dx.view(), vr = drp.view(), vo = dout.view();
  kf::GatherReduceArgs a;
  a.name = "segment_sum";
  a.x = &vx, a.rowptr = &vr, a.out = &vo;
  KF_EXPECT_INVALID(kf::gather_reduce(a, nullptr, 0, nullptr), "segment_sum: the workspace must hold");
}

}  // namespace
