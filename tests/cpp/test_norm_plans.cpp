// Every candidate plan (norm_plan.h candidate_plans) of each shape through launch_with_plan, against
// the float64 reference: every kernel kind and variant the planner could choose (or a sweep could put
// in its tables) is correct on the device, not only the default one. The reference is computed once
// per op and shape; every plan's outputs are poisoned before it runs. Shapes are small enough to run
// all candidates (about 10-40 per shape) and cover every kind: bulk pipelines and chunks at few rows,
// clusters (2x131072), split and streaming backward (67x12288, 2x131072), scalar heads (odd N and
// the unaligned layout).
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/kernelforge.h"
#include "norm/norm_plan.h"
#include "norm/norm_problem.h"
#include "test_norm_common.h"

namespace {

using namespace kftest_norm;

struct PlanShape {
  int64_t b, s, n;  // x [b, s, n]
};
const PlanShape kPlanShapes[] = {{1, 1, 1},      {1, 7, 1000},   {1, 3, 4096},   {1, 19, 4097}, {2, 32, 8192},
                                 {1, 333, 1600}, {1, 67, 12288}, {1, 2, 131072}, {1, 40, 8191}, {2, 259, 2048}};
using PlanCase = std::tuple<DType, PlanShape, LayoutKind>;
void PrintTo(const PlanShape& s, std::ostream* os) { *os << s.b << "x" << s.s << "x" << s.n; }

struct Out {
  const char* name;
  DeviceTensor* got;
  const HostTensor* want;
  Tol tol;
};

class NormGpuPlans : public ::testing::TestWithParam<PlanCase>, public GpuFixture {
 protected:
  void SetUp() override { gpu_setup(dtype()); }
  void TearDown() override { gpu_teardown(); }
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t B() const { return std::get<1>(GetParam()).b; }
  int64_t S() const { return std::get<1>(GetParam()).s; }
  int64_t N() const { return std::get<1>(GetParam()).n; }
  std::vector<int64_t> xs() const { return {B(), S(), N()}; }
  Layout rows() const { return row_layout(std::get<2>(GetParam())); }
  Layout params() const { return param_layout(std::get<2>(GetParam())); }
  Rng rng(const char* op) const {
    return Rng(hash_str(std::string(op) + ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  Tol rtol(int64_t terms) const { return reduction_tolerance(dtype(), terms); }

  // Runs `c` with every candidate plan and compares the outputs.
  void run_all(const kf::NormCall& c, std::vector<Out> outs) {
    std::vector<kf::NormPlan> plans;
    KF_ASSERT_OK(kf::candidate_plans_for(c, &plans));
    ASSERT_FALSE(plans.empty());
    for (const kf::NormPlan& plan : plans) {
      SCOPED_TRACE(kf::to_string(plan));
      for (Out& o : outs) o.got->poison();
      if (c.backward) {
        ASSERT_TRUE(finish(with_workspace(
            [&](void* ws, size_t* bytes) { return kf::launch_with_plan(plan, c, ws, bytes, stream_); })));
      } else {
        ASSERT_TRUE(finish(kf::launch_with_plan(plan, c, nullptr, nullptr, stream_)));
      }
      EXPECT_EQ(kf::last_plan(), kf::to_string(plan));
      for (Out& o : outs) {
        EXPECT_TRUE(all_close(o.name, o.got->download(), *o.want, o.tol));
        EXPECT_TRUE(o.got->check_untouched(o.name));
      }
    }
  }
};

kf::NormCall call(const char* name, kf::NormOp op, bool backward, float eps) {
  kf::NormCall c;
  c.name = name;
  c.op = op;
  c.backward = backward;
  c.cuda = true;
  c.eps = eps;
  return c;
}

TEST_P(NormGpuPlans, RmsAndAddRms) {
  const DType t = dtype();
  Rng r = rng("rms");
  HostTensor x = random_tensor(t, xs(), r), res = random_tensor(t, xs(), r), w = random_weight(t, {N()}, r);
  HostTensor dy = random_tensor(t, xs(), r), dsum = random_tensor(t, xs(), r);
  TensorView wv = w.view(), dsv = dsum.view();
  HostTensor y(t, xs()), s(t, xs()), dx(t, xs()), dw(t, {N()}), ay(t, xs()), adx(t, xs()), adw(t, {N()});
  TensorView dwv = dw.view(), adwv = adw.view();
  KF_ASSERT_OK(ref::rms_norm(x.view(), &wv, kRmsEps, y.view()));
  KF_ASSERT_OK(ref::add_rms_norm(x.view(), res.view(), &wv, kRmsEps, ay.view(), s.view()));
  KF_ASSERT_OK(ref::rms_norm_backward(dy.view(), x.view(), &wv, kRmsEps, dx.view(), &dwv));
  KF_ASSERT_OK(ref::add_rms_norm_backward(dy.view(), &dsv, x.view(), &wv, kRmsEps, adx.view(), &adwv));

  DeviceTensor d_x = to_device(x, rows()), d_res = to_device(res, rows()), d_w = to_device(w, params());
  DeviceTensor d_dy = to_device(dy, rows()), d_dsum = to_device(dsum, rows());
  DeviceTensor d_y(t, xs(), rows()), d_s(t, xs(), rows()), d_dx(t, xs(), rows()), d_dw(t, {N()}, params());
  TensorView xv = d_x.view(), resv = d_res.view(), wdv = d_w.view(), yv = d_y.view(), sv = d_s.view();
  TensorView dyv = d_dy.view(), dsumv = d_dsum.view(), dxv = d_dx.view(), dwdv = d_dw.view();
  const int64_t M = B() * S();
  {
    SCOPED_TRACE("rms_norm");
    kf::NormCall c = call("rms_norm", kf::NormOp::kRms, false, kRmsEps);
    c.x = &xv, c.weight = &wdv, c.y = &yv;
    run_all(c, {{"y", &d_y, &y, tolerance(t)}});
  }
  {
    SCOPED_TRACE("add_rms_norm");
    kf::NormCall c = call("add_rms_norm", kf::NormOp::kAddRms, false, kRmsEps);
    c.x = &xv, c.residual = &resv, c.weight = &wdv, c.y = &yv, c.sum = &sv;
    run_all(c, {{"y", &d_y, &ay, tolerance(t)}, {"sum", &d_s, &s, tolerance(t)}});
  }
  {
    SCOPED_TRACE("rms_norm_backward");
    kf::NormCall c = call("rms_norm_backward", kf::NormOp::kRms, true, kRmsEps);
    c.dy = &dyv, c.x = &xv, c.weight = &wdv, c.dx = &dxv, c.dweight = &dwdv;
    run_all(c, {{"dx", &d_dx, &dx, tolerance(t)}, {"dweight", &d_dw, &dw, rtol(M)}});
  }
  {
    SCOPED_TRACE("add_rms_norm_backward");
    kf::NormCall c = call("add_rms_norm_backward", kf::NormOp::kAddRms, true, kRmsEps);
    c.dy = &dyv, c.dsum = &dsumv, c.x = &xv, c.weight = &wdv, c.dx = &dxv, c.dweight = &dwdv;
    run_all(c, {{"dx", &d_dx, &adx, tolerance(t)}, {"dweight", &d_dw, &adw, rtol(M)}});
  }
}

TEST_P(NormGpuPlans, LayerNorm) {
  const DType t = dtype();
  Rng r = rng("layer");
  HostTensor x = random_tensor(t, xs(), r, -1.0, 3.0), w = random_weight(t, {N()}, r), b = random_tensor(t, {N()}, r);
  HostTensor dy = random_tensor(t, xs(), r);
  TensorView wv = w.view(), bv = b.view();
  HostTensor y(t, xs()), dx(t, xs()), dw(t, {N()}), db(t, {N()});
  TensorView dwv = dw.view(), dbv = db.view();
  KF_ASSERT_OK(ref::layer_norm(x.view(), &wv, &bv, kLayerEps, y.view()));
  KF_ASSERT_OK(ref::layer_norm_backward(dy.view(), x.view(), &wv, &bv, kLayerEps, dx.view(), &dwv, &dbv));

  DeviceTensor d_x = to_device(x, rows()), d_w = to_device(w, params()), d_b = to_device(b, params());
  DeviceTensor d_dy = to_device(dy, rows());
  DeviceTensor d_y(t, xs(), rows()), d_dx(t, xs(), rows()), d_dw(t, {N()}, params()), d_db(t, {N()}, params());
  TensorView xv = d_x.view(), wdv = d_w.view(), bdv = d_b.view(), yv = d_y.view();
  TensorView dyv = d_dy.view(), dxv = d_dx.view(), dwdv = d_dw.view(), dbdv = d_db.view();
  const int64_t M = B() * S();
  {
    SCOPED_TRACE("layer_norm");
    kf::NormCall c = call("layer_norm", kf::NormOp::kLayer, false, kLayerEps);
    c.x = &xv, c.weight = &wdv, c.bias = &bdv, c.y = &yv;
    run_all(c, {{"y", &d_y, &y, tolerance(t)}});
  }
  {
    SCOPED_TRACE("layer_norm_backward");
    kf::NormCall c = call("layer_norm_backward", kf::NormOp::kLayer, true, kLayerEps);
    c.dy = &dyv, c.x = &xv, c.weight = &wdv, c.bias = &bdv, c.dx = &dxv, c.dweight = &dwdv, c.dbias = &dbdv;
    run_all(c, {{"dx", &d_dx, &dx, tolerance(t)}, {"dweight", &d_dw, &dw, rtol(M)}, {"dbias", &d_db, &db, rtol(M)}});
  }
}

// AdaLN, LayerNorm kind with scale/shift [B, 1, N] and no weight/bias (DiT: the plain output loop,
// grouped gradients); RMS kind with scale/shift [B, S, N] and weight + bias (per-row gradients).
TEST_P(NormGpuPlans, AdaNorm) {
  const DType t = dtype();
  for (bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "layer kind, scale/shift [B,1,N], no affine" : "rms kind, scale/shift [B,S,N], affine");
    Rng r = rng(grouped ? "ada_grouped" : "ada_rows");
    const NormKind kind = grouped ? NormKind::kLayer : NormKind::kRms;
    const std::vector<int64_t> ms = grouped ? std::vector<int64_t>{B(), 1, N()} : xs();
    HostTensor x = random_tensor(t, xs(), r, -1.0, 3.0), dy = random_tensor(t, xs(), r);
    HostTensor sc = random_tensor(t, ms, r, -0.5, 0.5), sh = random_tensor(t, ms, r);
    HostTensor w = random_weight(t, {N()}, r), b = random_tensor(t, {N()}, r);
    TensorView wv = w.view(), bv = b.view();
    const TensorView* wp = grouped ? nullptr : &wv;
    const TensorView* bp = grouped ? nullptr : &bv;
    HostTensor y(t, xs()), dx(t, xs()), dsc(t, ms), dsh(t, ms), dw(t, {N()}), db(t, {N()});
    TensorView dscv = dsc.view(), dshv = dsh.view(), dwv = dw.view(), dbv = db.view();
    KF_ASSERT_OK(ref::ada_norm(x.view(), sc.view(), sh.view(), wp, bp, kLayerEps, kind, y.view()));
    KF_ASSERT_OK(ref::ada_norm_backward(dy.view(), x.view(), sc.view(), sh.view(), wp, bp, kLayerEps, kind, dx.view(),
                                        &dscv, &dshv, grouped ? nullptr : &dwv, grouped ? nullptr : &dbv));

    DeviceTensor d_x = to_device(x, rows()), d_dy = to_device(dy, rows());
    DeviceTensor d_sc = to_device(sc, params()), d_sh = to_device(sh, params());
    DeviceTensor d_w = to_device(w, params()), d_b = to_device(b, params());
    DeviceTensor d_y(t, xs(), rows()), d_dx(t, xs(), rows()), d_dsc(t, ms, params()), d_dsh(t, ms, params());
    DeviceTensor d_dw(t, {N()}, params()), d_db(t, {N()}, params());
    TensorView xv = d_x.view(), dyv = d_dy.view(), scv = d_sc.view(), shv = d_sh.view(), wdv = d_w.view();
    TensorView bdv = d_b.view(), yv = d_y.view(), dxv = d_dx.view(), dscdv = d_dsc.view(), dshdv = d_dsh.view();
    TensorView dwdv = d_dw.view(), dbdv = d_db.view();
    const kf::NormOp op = grouped ? kf::NormOp::kAdaLayer : kf::NormOp::kAdaRms;
    const int64_t M = B() * S(), terms = grouped ? S() : 1;
    {
      SCOPED_TRACE("ada_norm");
      kf::NormCall c = call("ada_norm", op, false, kLayerEps);
      c.kind = kind;
      c.x = &xv, c.scale = &scv, c.shift = &shv, c.y = &yv;
      if (!grouped) c.weight = &wdv, c.bias = &bdv;
      run_all(c, {{"y", &d_y, &y, tolerance(t)}});
    }
    {
      SCOPED_TRACE("ada_norm_backward");
      kf::NormCall c = call("ada_norm_backward", op, true, kLayerEps);
      c.kind = kind;
      c.dy = &dyv, c.x = &xv, c.scale = &scv, c.shift = &shv, c.dx = &dxv, c.dscale = &dscdv, c.dshift = &dshdv;
      std::vector<Out> outs = {{"dx", &d_dx, &dx, tolerance(t)},
                               {"dscale", &d_dsc, &dsc, rtol(terms)},
                               {"dshift", &d_dsh, &dsh, rtol(terms)}};
      if (!grouped) {
        c.weight = &wdv, c.bias = &bdv, c.dweight = &dwdv, c.dbias = &dbdv;
        outs.push_back({"dweight", &d_dw, &dw, rtol(M)});
        outs.push_back({"dbias", &d_db, &db, rtol(M)});
      }
      run_all(c, outs);
    }
  }
}

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> out;
  for (DType t : kDtypes)
    for (const PlanShape& s : kPlanShapes)
      for (LayoutKind l : {LayoutKind::kContiguous, LayoutKind::kOddStride, LayoutKind::kUnaligned})
        out.emplace_back(t, s, l);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormGpuPlans, ::testing::ValuesIn(plan_cases()),
                         [](const ::testing::TestParamInfo<PlanCase>& i) {
                           const PlanShape& s = std::get<1>(i.param);
                           return std::string(dtype_tag(std::get<0>(i.param))) + "_" + std::to_string(s.b) + "x" +
                                  std::to_string(s.s) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(i.param));
                         });

}  // namespace
