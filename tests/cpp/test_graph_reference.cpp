// The float64 CPU reference of the graph family (kernelforge::ref) checked on its own, without a GPU:
//  - segment sum / mean / max and the gather form (col, eid, edge weights) against hand values,
//    empty segments (0, argmax -1) and ties (the first maximum);
//  - the backward contracts against central finite differences of the forward: segment_reduce_backward
//    for x, and for gather_scatter the transposed gather-reduce (scale_rowptr for mean, mask_arg for
//    max) for x and edge_weight_grad for the weights, exactly as the PyTorch binding composes them;
//  - the index checks (rowptr start, order and end; col, src, dst ranges).
// These run on CI (no GPU), so the oracle the GPU tests trust is itself tested.
#include <functional>
#include <vector>

#include "test_graph_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kf::GraphReduce;

HostTensor make(DType t, std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor h(t, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i) h.set(i, values[i]);
  return h;
}

void expect_values(const char* what, const HostTensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.get(i), want[i], 1e-14) << what << " [" << i << "]";
}

const DType f64 = DType::kFloat64;

// x [5, 2], segments {0, 1}, {}, {2, 3, 4}
struct SegmentCase {
  HostTensor x = make(f64, {5, 2}, {1, 2, 3, -1, 0, 5, -2, 4, 3, 1});
  HostTensor rowptr = index_tensor(DType::kInt64, {0, 2, 2, 5});
};

TEST(GraphReference, SegmentHandValues) {
  SegmentCase c;
  const std::vector<double> want[] = {{4, 1, 0, 0, 1, 10}, {2, 0.5, 0, 0, 1.0 / 3, 10.0 / 3}, {3, 2, 0, 0, 3, 5}};
  const GraphReduce reduces[] = {GraphReduce::kSum, GraphReduce::kMean, GraphReduce::kMax};
  for (int r = 0; r < 3; ++r) {
    HostTensor out(f64, {3, 2}), arg(DType::kInt32, {3, 2});
    const kf::TensorView xv = c.x.view(), rv = c.rowptr.view(), ov = out.view(), av = arg.view();
    kf::GatherReduceArgs a;
    a.x = &xv, a.rowptr = &rv, a.out = &ov, a.reduce = reduces[r];
    if (reduces[r] == GraphReduce::kMax) a.argmax = &av;
    KF_ASSERT_OK(ref::gather_reduce(a));
    expect_values("segment out", out, want[r]);
    if (reduces[r] == GraphReduce::kMax) expect_values("segment argmax", arg, {1, 0, -1, -1, 4, 2});
  }
}

TEST(GraphReference, MaxTiesTakeTheFirstRow) {
  HostTensor x = make(f64, {3, 1}, {3, 3, 1}), rp = index_tensor(DType::kInt32, {0, 3});
  HostTensor out(f64, {1, 1}), arg(DType::kInt32, {1, 1});
  const kf::TensorView xv = x.view(), rv = rp.view(), ov = out.view(), av = arg.view();
  kf::GatherReduceArgs a;
  a.x = &xv, a.rowptr = &rv, a.out = &ov, a.argmax = &av, a.reduce = GraphReduce::kMax;
  KF_ASSERT_OK(ref::gather_reduce(a));
  expect_values("max", out, {3});
  expect_values("argmax", arg, {0});
}

// nodes x = [1, 2, 4]; edges (src -> dst, w): (0 -> 1, 2), (2 -> 0, 1), (1 -> 1, -1), (2 -> 1, 0.5)
TEST(GraphReference, GatherHandValues) {
  HostTensor x = make(f64, {3, 1}, {1, 2, 4}), w = make(f64, {4}, {2, 1, -1, 0.5});
  HostTensor rp = index_tensor(DType::kInt64, {0, 1, 4}), col = index_tensor(DType::kInt64, {2, 0, 1, 2});
  HostTensor eid = index_tensor(DType::kInt64, {1, 0, 2, 3});
  const std::vector<double> want[] = {{4, 2}, {4, 2.0 / 3}, {4, 2}};
  const GraphReduce reduces[] = {GraphReduce::kSum, GraphReduce::kMean, GraphReduce::kMax};
  for (int r = 0; r < 3; ++r) {
    HostTensor out(f64, {2, 1}), arg(DType::kInt32, {2, 1});
    const kf::TensorView xv = x.view(), wv = w.view(), rv = rp.view(), cv = col.view(), ev = eid.view();
    const kf::TensorView ov = out.view(), av = arg.view();
    kf::GatherReduceArgs a;
    a.x = &xv, a.rowptr = &rv, a.col = &cv, a.eid = &ev, a.weight = &wv, a.out = &ov, a.reduce = reduces[r];
    if (reduces[r] == GraphReduce::kMax) a.argmax = &av;
    KF_ASSERT_OK(ref::gather_reduce(a));
    expect_values("gather out", out, want[r]);
    if (reduces[r] == GraphReduce::kMax) expect_values("gather argmax (edge ids)", arg, {1, 0});
  }
}

// f(x, w) = sum(out * dout): its gradients by the backward contracts against central differences.
TEST(GraphReference, GatherBackwardMatchesFiniteDifferences) {
  Rng rng(hash_str("GraphReference.GatherBackward"));
  const int64_t N = 5, X = 6, E = 23, F = 3;
  const EdgeGraph g = make_edges(N, X, E, 6, rng);
  HostTensor x = random_tensor(f64, {X, F}, rng), w = random_tensor(f64, {E}, rng),
             dout = random_tensor(f64, {N, F}, rng);
  HostTensor rp = index_tensor(DType::kInt64, g.rowptr), col = index_tensor(DType::kInt64, g.col);
  HostTensor eid = index_tensor(DType::kInt64, g.eid), rpt = index_tensor(DType::kInt64, g.rowptr_t);
  HostTensor colt = index_tensor(DType::kInt64, g.col_t), eidt = index_tensor(DType::kInt64, g.eid_t);
  HostTensor src = index_tensor(DType::kInt64, g.src), dst = index_tensor(DType::kInt64, g.dst);
  for (GraphReduce r : {GraphReduce::kSum, GraphReduce::kMean, GraphReduce::kMax}) {
    const bool max = r == GraphReduce::kMax;
    HostTensor arg(DType::kInt32, {N, F});
    auto forward = [&](const HostTensor& xx, const HostTensor& ww) {
      HostTensor out(f64, {N, F});
      const kf::TensorView xv = xx.view(), wv = ww.view(), rv = rp.view(), cv = col.view(), ev = eid.view();
      const kf::TensorView ov = out.view(), av = arg.view();
      kf::GatherReduceArgs a;
      a.x = &xv, a.rowptr = &rv, a.col = &cv, a.eid = &ev, a.weight = &wv, a.out = &ov, a.reduce = r;
      if (max) a.argmax = &av;
      EXPECT_TRUE(ref::gather_reduce(a).ok());
      double f = 0;
      for (int64_t i = 0; i < N * F; ++i) f += out.get(i) * dout.get(i);
      return f;
    };
    forward(x, w);  // argmax of the unperturbed inputs
    HostTensor dx(f64, {X, F}), dw(f64, {E});
    const kf::TensorView dov = dout.view(), rtv = rpt.view(), ctv = colt.view(), etv = eidt.view(), wv = w.view();
    const kf::TensorView rv = rp.view(), av = arg.view(), dxv = dx.view(), xv = x.view(), sv = src.view();
    const kf::TensorView dv = dst.view(), dwv = dw.view();
    kf::GatherReduceArgs b;
    b.x = &dov, b.rowptr = &rtv, b.col = &ctv, b.eid = &etv, b.weight = &wv, b.out = &dxv;
    if (r == GraphReduce::kMean) b.scale_rowptr = &rv;
    if (max) b.mask_arg = &av;
    KF_ASSERT_OK(ref::gather_reduce(b));
    KF_ASSERT_OK(ref::edge_weight_grad("t", dov, xv, sv, dv, rv, r, max ? &av : nullptr, dwv));
    const double h = 1e-6;
    for (int64_t i = 0; i < X * F; ++i) {
      HostTensor xp = x, xm = x;
      xp.set(i, x.get(i) + h), xm.set(i, x.get(i) - h);
      EXPECT_NEAR(dx.get(i), (forward(xp, w) - forward(xm, w)) / (2 * h), 1e-7) << "dx " << i << " reduce " << int(r);
    }
    for (int64_t e = 0; e < E; ++e) {
      HostTensor wp = w, wm = w;
      wp.set(e, w.get(e) + h), wm.set(e, w.get(e) - h);
      EXPECT_NEAR(dw.get(e), (forward(x, wp) - forward(x, wm)) / (2 * h), 1e-7) << "dw " << e << " reduce " << int(r);
    }
  }
}

TEST(GraphReference, SegmentBackwardMatchesFiniteDifferences) {
  Rng rng(hash_str("GraphReference.SegmentBackward"));
  const int64_t N = 6, nnz = 17, F = 2;
  const std::vector<int64_t> rows = rowptr_of(skewed_targets(N, nnz, 5, rng), N);
  HostTensor x = random_tensor(f64, {nnz, F}, rng), dout = random_tensor(f64, {N, F}, rng);
  HostTensor rp = index_tensor(DType::kInt32, rows);
  for (GraphReduce r : {GraphReduce::kSum, GraphReduce::kMean, GraphReduce::kMax}) {
    HostTensor arg(DType::kInt32, {N, F});
    auto forward = [&](const HostTensor& xx) {
      HostTensor out(f64, {N, F});
      const kf::TensorView xv = xx.view(), rv = rp.view(), ov = out.view(), av = arg.view();
      kf::GatherReduceArgs a;
      a.x = &xv, a.rowptr = &rv, a.out = &ov, a.reduce = r;
      if (r == GraphReduce::kMax) a.argmax = &av;
      EXPECT_TRUE(ref::gather_reduce(a).ok());
      double f = 0;
      for (int64_t i = 0; i < N * F; ++i) f += out.get(i) * dout.get(i);
      return f;
    };
    forward(x);
    HostTensor dx(f64, {nnz, F});
    const kf::TensorView dov = dout.view(), rv = rp.view(), av = arg.view(), dxv = dx.view();
    KF_ASSERT_OK(ref::segment_reduce_backward("t", dov, rv, r, r == GraphReduce::kMax ? &av : nullptr, dxv));
    const double h = 1e-6;
    for (int64_t i = 0; i < nnz * F; ++i) {
      HostTensor xp = x, xm = x;
      xp.set(i, x.get(i) + h), xm.set(i, x.get(i) - h);
      EXPECT_NEAR(dx.get(i), (forward(xp) - forward(xm)) / (2 * h), 1e-7) << "dx " << i << " reduce " << int(r);
    }
  }
}

TEST(GraphReference, RoundsOnceToTheDtype) {
  // 1 + 2^-8 + 2^-8 in bfloat16 (ulp(1) = 2^-7): one rounding of the exact sum gives 1 + 2^-7;
  // rounding after each addition would give 1 (1 + 2^-8 is a tie that rounds to even).
  HostTensor x = make(DType::kBFloat16, {3, 1}, {1, 0, 0}), rp = index_tensor(DType::kInt64, {0, 3});
  x.set(1, std::ldexp(1.0, -8));
  x.set(2, std::ldexp(1.0, -8));
  HostTensor out(DType::kBFloat16, {1, 1});
  const kf::TensorView xv = x.view(), rv = rp.view(), ov = out.view();
  kf::GatherReduceArgs a;
  a.x = &xv, a.rowptr = &rv, a.out = &ov;
  KF_ASSERT_OK(ref::gather_reduce(a));
  EXPECT_EQ(out.get(0), 1.0 + std::ldexp(1.0, -7));
}

TEST(GraphReference, ChecksIndices) {
  HostTensor x = make(f64, {3, 1}, {1, 2, 3}), out(f64, {2, 1});
  auto run = [&](std::vector<int64_t> rowptr, std::vector<int64_t> col) {
    HostTensor rp = index_tensor(DType::kInt64, rowptr), c = index_tensor(DType::kInt64, col);
    const kf::TensorView xv = x.view(), rv = rp.view(), cv = c.view(), ov = out.view();
    kf::GatherReduceArgs a;
    a.name = "gather_scatter";
    a.x = &xv, a.rowptr = &rv, a.out = &ov;
    if (!col.empty()) a.col = &cv;
    return ref::gather_reduce(a);
  };
  KF_EXPECT_INVALID(run({1, 2, 3}, {}), "gather_scatter", "rowptr[0] must be 0");
  KF_EXPECT_INVALID(run({0, 2, 1}, {}), "rowptr must be non-decreasing");
  KF_EXPECT_INVALID(run({0, 1, 2}, {}), "rowptr[-1] must equal the number of positions (3)");
  KF_EXPECT_INVALID(run({0, 1, 2}, {0, 3}), "col[1] = 3 is out of range [0, 3)");
  KF_EXPECT_INVALID(run({0, 1, 2}, {-1, 0}), "col[0] = -1 is out of range");
  KF_ASSERT_OK(run({0, 1, 2}, {2, 0}));
  EXPECT_EQ(out.get(0), 3.0);
  EXPECT_EQ(out.get(1), 1.0);

  HostTensor dout = make(f64, {2, 1}, {1, 1}), dw(f64, {2}), rp = index_tensor(DType::kInt64, {0, 1, 2});
  HostTensor src = index_tensor(DType::kInt64, {0, 5}), dst = index_tensor(DType::kInt64, {0, 1});
  KF_EXPECT_INVALID(ref::edge_weight_grad("gather_scatter_backward", dout.view(), x.view(), src.view(), dst.view(),
                                          rp.view(), GraphReduce::kSum, nullptr, dw.view()),
                    "src[1] = 5 is out of range [0, 3)");
}

}  // namespace
