// merge_attention_states: the float64 reference (CPU) and the kernel (GPU) against the closed form
// computed here in double, and the argument checks.
//
// Closed form per row n, head h: m = max(lse_a, lse_b), w_a = e^(lse_a - m), w_b = e^(lse_b - m),
// out = (w_a o_a + w_b o_b) / (w_a + w_b), lse = m + log(w_a + w_b); a -inf side contributes nothing
// (its o holds NaN here: it must never be multiplied), both -inf give 0 and -inf.
//
// Cases: 1, 7 and 64 rows and no rows, odd H and D (the one-element path), d64 / d128 / d256, every
// dtype (float64 on CPU only), strided views (o_a with a padded head stride and a base one element
// past alignment, o_b a transpose of [H, N, D] memory, lse_a the transpose of attention's [H, N] layout,
// lse_b every other element), in place (out is o_a), and without out_lse. Every output allocation is
// filled with NaN bytes first; the bytes outside the out view must keep them. Tolerance: float32 math
// rounded once (the dtype's test tolerance; lse 1e-6 relative).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "decode/merge_states.h"
#include "kernelforge/decode.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using kf::MergeStatesTensors;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType F64 = DType::kFloat64;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A strided tensor in a host image of its own: `offset` elements, then the view's span, then a guard;
// every byte outside the view starts as 0xFF (NaN in every float dtype).
struct Image {
  DType dtype = F32;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
  std::vector<unsigned char> bytes;

  Image() = default;
  Image(DType t, std::vector<int64_t> s, std::vector<int64_t> st, int64_t off = 0)
      : dtype(t), shape(std::move(s)), strides(std::move(st)), offset(off) {
    int64_t span = 1;
    for (size_t d = 0; d < shape.size(); ++d) span += shape[d] > 0 ? (shape[d] - 1) * strides[d] : 0;
    bytes.assign(size_t(offset + span + 16) * kf::dtype_size(t), 0xFF);
  }
  int64_t at(int64_t i, int64_t j, int64_t k = 0) const {
    return offset + i * strides[0] + j * strides[1] + (shape.size() > 2 ? k * strides[2] : 0);
  }
  double get(int64_t e) const { return load(bytes.data(), dtype, e); }
  void set(int64_t e, double v) { store(bytes.data(), dtype, e, v); }
  TensorView view(void* base, bool cuda) const {
    TensorView v;
    v.data = static_cast<unsigned char*>(base) + offset * kf::dtype_size(dtype);
    v.dtype = dtype;
    v.device = Device{cuda ? DeviceType::kCUDA : DeviceType::kCPU, 0};
    v.ndim = int(shape.size());
    for (int d = 0; d < v.ndim; ++d) v.shape[d] = shape[d], v.strides[d] = strides[d];
    return v;
  }
};

struct DeviceImage {
  void* ptr = nullptr;
  size_t n = 0;
  explicit DeviceImage(const Image& im) : n(im.bytes.size()) {
    if (cudaMalloc(&ptr, n) != cudaSuccess ||
        cudaMemcpy(ptr, im.bytes.data(), n, cudaMemcpyHostToDevice) != cudaSuccess)
      ptr = nullptr;
  }
  ~DeviceImage() {
    if (ptr) cudaFree(ptr);
  }
  DeviceImage(const DeviceImage&) = delete;
  DeviceImage& operator=(const DeviceImage&) = delete;
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(n);
    cudaMemcpy(h.data(), ptr, n, cudaMemcpyDeviceToHost);
    return h;
  }
};

struct MergeCase {
  std::string name;
  DType dtype = BF16;
  int64_t N = 7, H = 4, D = 128;
  int64_t pad = 0;              // o_a's head stride D + pad
  int64_t offset = 0;           // o_a's base, elements past the allocation's 256-byte aligned start
  bool b_transposed = false;    // o_b: [N, H, D] view of [H, N, D] memory
  bool lse_transposed = false;  // lse_a: [N, H] view of [H, N] memory (attention's layout)
  bool inplace = false;         // out is o_a
  bool lse_out = true;
};

void PrintTo(const MergeCase& c, std::ostream* os) { *os << c.name; }

// The inputs of a case: random o in [-2, 2) and lse in [-6, 6); lse_a -inf at every 5th (row, head),
// lse_b at every 7th, both at every 11th starting at 3; o NaN wherever its lse is -inf.
struct Inputs {
  Image oa, ob, la, lb, out, lo;
  Inputs(const MergeCase& c) {
    const int64_t N = c.N, H = c.H, D = c.D, hs = D + c.pad;
    oa = Image(c.dtype, {N, H, D}, {H * hs, hs, 1}, c.offset);
    ob = c.b_transposed ? Image(c.dtype, {N, H, D}, {D, N * D, 1}) : Image(c.dtype, {N, H, D}, {H * D, D, 1});
    la = c.lse_transposed ? Image(F32, {N, H}, {1, N}) : Image(F32, {N, H}, {H, 1});
    lb = Image(F32, {N, H}, {2 * H, 2});
    out = Image(c.dtype, {N, H, D}, {H * (D + 8), D + 8, 1});
    lo = Image(F32, {N, H}, {H, 1});
    Rng rng(hash_str(c.name));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t r = n * H + h;
        const bool ia = r % 5 == 0 || r % 11 == 3, ib = r % 7 == 1 || r % 11 == 3;
        la.set(la.at(n, h), ia ? kNegInf : double(float(rng.uniform(-6, 6))));
        lb.set(lb.at(n, h), ib ? kNegInf : double(float(rng.uniform(-6, 6))));
        for (int64_t d = 0; d < D; ++d) {
          oa.set(oa.at(n, h, d), ia ? std::nan("") : round_to(c.dtype, rng.uniform(-2, 2)));
          ob.set(ob.at(n, h, d), ib ? std::nan("") : round_to(c.dtype, rng.uniform(-2, 2)));
        }
      }
  }
};

// The closed form in double: want_out [N * H * D] (row-major), want_lse [N * H].
void closed_form(const Inputs& in, int64_t N, int64_t H, int64_t D, std::vector<double>* out,
                 std::vector<double>* lse) {
  out->assign(size_t(N * H * D), 0.0);
  lse->assign(size_t(N * H), kNegInf);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const double a = in.la.get(in.la.at(n, h)), b = in.lb.get(in.lb.at(n, h));
      const double m = std::max(a, b);
      if (m == kNegInf) continue;  // both -inf: 0, -inf
      const double wa = std::exp(a - m), wb = std::exp(b - m);
      (*lse)[size_t(n * H + h)] = m + std::log(wa + wb);
      for (int64_t d = 0; d < D; ++d) {
        double s = 0.0;
        if (wa > 0.0) s += wa * in.oa.get(in.oa.at(n, h, d));
        if (wb > 0.0) s += wb * in.ob.get(in.ob.at(n, h, d));
        (*out)[size_t((n * H + h) * D + d)] = s / (wa + wb);
      }
    }
}

// out and out_lse of a finished call (images `got_out` / `got_lse`, `outs`' layouts) against the closed
// form, and every byte of the out image outside its view still 0xFF.
::testing::AssertionResult matches(const MergeCase& c, const Image& out_layout,
                                   const std::vector<unsigned char>& got_out, const Image& lse_layout,
                                   const std::vector<unsigned char>* got_lse, const std::vector<double>& want,
                                   const std::vector<double>& want_lse) {
  const int64_t N = c.N, H = c.H, D = c.D;
  const Tol tol = c.dtype == F64 ? Tol{1e-12, 1e-12} : tolerance(c.dtype);
  std::vector<bool> covered(got_out.size() / kf::dtype_size(c.dtype), false);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        const int64_t e = out_layout.at(n, h, d);
        covered[size_t(e)] = true;
        const double g = load(got_out.data(), c.dtype, e), w = want[size_t((n * H + h) * D + d)];
        if (!(std::fabs(g - w) <= tol.atol + tol.rtol * std::fabs(w)))
          return ::testing::AssertionFailure()
                 << "out[" << n << ", " << h << ", " << d << "] = " << g << ", want " << w;
      }
      if (got_lse == nullptr) continue;
      const double g = load(got_lse->data(), F32, lse_layout.at(n, h)), w = want_lse[size_t(n * H + h)];
      const bool ok = w == kNegInf ? g == kNegInf : std::fabs(g - w) <= 1e-6 * (1.0 + std::fabs(w));
      if (!ok) return ::testing::AssertionFailure() << "lse[" << n << ", " << h << "] = " << g << ", want " << w;
    }
  const size_t es = kf::dtype_size(c.dtype);
  for (size_t e = 0; e < covered.size(); ++e)
    if (!covered[e])
      for (size_t b = 0; b < es; ++b)
        if (got_out[e * es + b] != 0xFF)
          return ::testing::AssertionFailure()
                 << "out's allocation element " << e << " lies outside the view and was written";
  return ::testing::AssertionSuccess();
}

std::vector<MergeCase> merge_cases(bool cpu) {
  std::vector<MergeCase> v;
  std::vector<DType> dtypes = {BF16, F16, F32};
  if (cpu) dtypes.push_back(F64);
  for (DType t : dtypes) {
    const std::string s = t == BF16 ? "bf16" : t == F16 ? "fp16" : t == F32 ? "fp32" : "fp64";
    MergeCase c;
    c.dtype = t, c.name = s + "_n7_h4_d128";
    v.push_back(c);
    c.N = 1, c.H = 1, c.D = 64, c.name = s + "_n1_h1_d64";
    v.push_back(c);
    c.N = 7, c.H = 5, c.D = 33, c.name = s + "_n7_h5_d33_odd";
    v.push_back(c);
    c.N = 64, c.H = 32, c.D = 128, c.b_transposed = true, c.lse_transposed = true, c.name = s + "_n64_h32_strided";
    v.push_back(c);
    c.N = 7, c.H = 3, c.D = 256, c.pad = 8, c.b_transposed = false, c.lse_transposed = true;
    c.name = s + "_n7_h3_d256_pad";
    v.push_back(c);
    c.offset = 1, c.name = s + "_n7_h3_d256_misaligned";  // the one-element path at a 16-byte-friendly D
    v.push_back(c);
    c = MergeCase{};
    c.dtype = t, c.N = 7, c.H = 3, c.D = 128, c.pad = 16, c.inplace = true, c.name = s + "_inplace";
    v.push_back(c);
    c.inplace = false, c.lse_out = false, c.name = s + "_no_lse";
    v.push_back(c);
    c = MergeCase{};
    c.dtype = t, c.N = 0, c.name = s + "_empty";
    v.push_back(c);
  }
  return v;
}

// Runs a case on the CPU reference (host images) or the GPU (device copies of them).
void run_case(const MergeCase& c, bool gpu) {
  const Inputs in(c);
  std::vector<double> want, want_lse;
  closed_form(in, c.N, c.H, c.D, &want, &want_lse);
  const Image& out_layout = c.inplace ? in.oa : in.out;
  MergeStatesTensors t;
  if (!gpu) {
    Inputs io(c);  // a copy whose out (or o_a, in place) and lse images the reference writes
    const TensorView oa = io.oa.view(io.oa.bytes.data(), false), ob = io.ob.view(io.ob.bytes.data(), false),
                     la = io.la.view(io.la.bytes.data(), false), lb = io.lb.view(io.lb.bytes.data(), false),
                     out = io.out.view(io.out.bytes.data(), false), lo = io.lo.view(io.lo.bytes.data(), false);
    t.o_a = &oa, t.o_b = &ob, t.lse_a = &la, t.lse_b = &lb, t.out = c.inplace ? &oa : &out;
    t.out_lse = c.lse_out ? &lo : nullptr;
    KF_ASSERT_OK(kf::ref::merge_attention_states(t));
    EXPECT_TRUE(matches(c, out_layout, c.inplace ? io.oa.bytes : io.out.bytes, io.lo,
                        c.lse_out ? &io.lo.bytes : nullptr, want, want_lse));
    return;
  }
  DeviceImage doa(in.oa), dob(in.ob), dla(in.la), dlb(in.lb), dout(in.out), dlo(in.lo);
  ASSERT_TRUE(doa.ptr && dob.ptr && dla.ptr && dlb.ptr && dout.ptr && dlo.ptr);
  const TensorView oa = in.oa.view(doa.ptr, true), ob = in.ob.view(dob.ptr, true), la = in.la.view(dla.ptr, true),
                   lb = in.lb.view(dlb.ptr, true), out = in.out.view(dout.ptr, true), lo = in.lo.view(dlo.ptr, true);
  t.o_a = &oa, t.o_b = &ob, t.lse_a = &la, t.lse_b = &lb, t.out = c.inplace ? &oa : &out;
  t.out_lse = c.lse_out ? &lo : nullptr;
  KF_ASSERT_OK(kf::merge_attention_states(t, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<unsigned char> got_out = c.inplace ? doa.download() : dout.download(), got_lse = dlo.download();
  EXPECT_TRUE(matches(c, out_layout, got_out, in.lo, c.lse_out ? &got_lse : nullptr, want, want_lse));
  if (!c.lse_out) {
    EXPECT_EQ(got_lse, in.lo.bytes) << "out_lse was not passed and must not be written";
  }
  EXPECT_EQ(dla.download(), in.la.bytes) << "lse_a was written";
  EXPECT_EQ(dob.download(), in.ob.bytes) << "o_b was written";
}

class MergeStatesReference : public ::testing::TestWithParam<MergeCase> {};
TEST_P(MergeStatesReference, MatchesClosedForm) { run_case(GetParam(), false); }
INSTANTIATE_TEST_SUITE_P(Cases, MergeStatesReference, ::testing::ValuesIn(merge_cases(true)),
                         [](const ::testing::TestParamInfo<MergeCase>& i) { return i.param.name; });

class MergeStatesGpu : public ::testing::TestWithParam<MergeCase> {};
TEST_P(MergeStatesGpu, MatchesClosedForm) {
  KF_NEED_GPU();
  if (GetParam().dtype == BF16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80";
  run_case(GetParam(), true);
}
INSTANTIATE_TEST_SUITE_P(Cases, MergeStatesGpu, ::testing::ValuesIn(merge_cases(false)),
                         [](const ::testing::TestParamInfo<MergeCase>& i) { return i.param.name; });

// Hand-computed rows: equal lse (the mean, lse + log 2), one side -inf (the other side exactly, NaN
// ignored), both -inf (0, -inf), a side 50 below the other (its weight e^-50 ~ 2e-22).
TEST(MergeStatesReference, HandComputed) {
  HostTensor oa(F64, {4, 1, 2}), ob(F64, {4, 1, 2}), la(F32, {4, 1}), lb(F32, {4, 1}), out(F64, {4, 1, 2}),
      lo(F32, {4, 1});
  const double a[8] = {1, 2, std::nan(""), std::nan(""), std::nan(""), std::nan(""), 4, 4};
  const double b[8] = {3, 6, 5, -1, std::nan(""), std::nan(""), 2, 8};
  for (int i = 0; i < 8; ++i) oa.set(i, a[i]), ob.set(i, b[i]);
  const double lsa[4] = {0.5, kNegInf, kNegInf, 10}, lsb[4] = {0.5, 2, kNegInf, -40};
  for (int i = 0; i < 4; ++i) la.set(i, lsa[i]), lb.set(i, lsb[i]);
  const TensorView voa = oa.view(), vob = ob.view(), vla = la.view(), vlb = lb.view(), vo = out.view(), vlo = lo.view();
  MergeStatesTensors t;
  t.o_a = &voa, t.o_b = &vob, t.lse_a = &vla, t.lse_b = &vlb, t.out = &vo, t.out_lse = &vlo;
  KF_ASSERT_OK(kf::ref::merge_attention_states(t));
  EXPECT_EQ(out.get(0), 2.0);
  EXPECT_EQ(out.get(1), 4.0);
  EXPECT_NEAR(lo.get(0), 0.5 + std::log(2.0), 1e-7);
  EXPECT_EQ(out.get(2), 5.0);
  EXPECT_EQ(out.get(3), -1.0);
  EXPECT_EQ(lo.get(1), 2.0);
  EXPECT_EQ(out.get(4), 0.0);
  EXPECT_EQ(out.get(5), 0.0);
  EXPECT_EQ(lo.get(2), kNegInf);
  EXPECT_NEAR(out.get(6), 4.0 - 2.0 * std::exp(-50.0), 1e-15);
  EXPECT_NEAR(out.get(7), 4.0 + 4.0 * std::exp(-50.0), 1e-15);
  EXPECT_NEAR(lo.get(3), 10.0, 1e-6);
}

// ---- validation --------------------------------------------------------------------------------

struct MergeViews {
  TensorView oa = cuda_view(BF16, {8, 4, 128}, 0, uintptr_t{1} << 40);
  TensorView ob = cuda_view(BF16, {8, 4, 128}, 0, uintptr_t{2} << 40);
  TensorView la = cuda_view(F32, {8, 4}, 0, uintptr_t{3} << 40);
  TensorView lb = cuda_view(F32, {8, 4}, 0, uintptr_t{4} << 40);
  TensorView out = cuda_view(BF16, {8, 4, 128}, 0, uintptr_t{5} << 40);
  TensorView lo = cuda_view(F32, {8, 4}, 0, uintptr_t{6} << 40);
  MergeStatesTensors t() const {
    MergeStatesTensors x;
    x.o_a = &oa, x.o_b = &ob, x.lse_a = &la, x.lse_b = &lb, x.out = &out, x.out_lse = &lo;
    return x;
  }
};

kf::Status validate(const MergeStatesTensors& t, bool cuda = true) {
  kf::MergeStatesParams p;
  DType d;
  return kf::validate_merge_states("merge_attention_states", cuda, t, &p, &d);
}

TEST(MergeStatesValidation, AcceptsAndRejects) {
  {
    MergeViews w;
    KF_ASSERT_OK(validate(w.t()));
    w.la.strides[0] = 1, w.la.strides[1] = 8;  // attention's [H, N] lse, transposed
    w.out = w.oa;                              // in place
    MergeStatesTensors t = w.t();
    t.out_lse = nullptr;
    kf::MergeStatesParams p;
    DType d;
    KF_ASSERT_OK(kf::validate_merge_states("merge_attention_states", true, t, &p, &d));
    EXPECT_EQ(p.la_sn, 1);
    EXPECT_EQ(p.la_sh, 8);
    EXPECT_EQ(p.rows, 8);
    EXPECT_EQ(p.heads, 4);
    EXPECT_EQ(p.head_dim, 128);
    EXPECT_EQ(p.out_lse, nullptr);
  }
  {
    MergeViews w;
    MergeStatesTensors t = w.t();
    t.o_a = nullptr;
    KF_EXPECT_INVALID(validate(t), "merge_attention_states: o_a must not be null");
    t = w.t();
    t.lse_b = nullptr;
    KF_EXPECT_INVALID(validate(t), "lse_b must not be null");
  }
  {
    MergeViews w;
    w.oa = cuda_view(BF16, {8, 512}, 0, uintptr_t{1} << 40);
    KF_EXPECT_INVALID(validate(w.t()), "o_a must have 3 dimensions [N, H, D], got 2 dimensions [8, 512]");
  }
  {
    MergeViews w;
    w.oa.dtype = w.ob.dtype = w.out.dtype = DType::kInt32;
    KF_EXPECT_INVALID(validate(w.t()), "o_a must be float16, bfloat16 or float32, got int32");
    w.oa.dtype = w.ob.dtype = w.out.dtype = F64;
    KF_EXPECT_INVALID(validate(w.t()), "o_a must be float16, bfloat16 or float32, got float64");
  }
  {
    MergeViews w;
    w.ob = cuda_view(BF16, {8, 4, 64}, 0, uintptr_t{2} << 40);
    KF_EXPECT_INVALID(validate(w.t()), "o_b must have o_a's shape [8, 4, 128], got [8, 4, 64]");
  }
  {
    MergeViews w;
    w.ob.dtype = F16;
    KF_EXPECT_INVALID(validate(w.t()), "o_b must have o_a's dtype (bfloat16), got float16");
  }
  {
    MergeViews w;
    w.oa.strides[2] = 2;
    KF_EXPECT_INVALID(validate(w.t()), "o_a must be contiguous in its last dimension (stride 1)");
  }
  {
    MergeViews w;
    w.ob.strides[0] = -512;
    KF_EXPECT_INVALID(validate(w.t()), "o_b must not have negative strides");
  }
  {
    MergeViews w;
    w.la = cuda_view(F32, {8, 3}, 0, uintptr_t{3} << 40);
    KF_EXPECT_INVALID(validate(w.t()), "lse_a must have shape [8, 4] (o_a's rows and heads), got [8, 3]");
  }
  {
    MergeViews w;
    w.lb.dtype = F64;
    KF_EXPECT_INVALID(validate(w.t()), "lse_b must be float32, got float64");
  }
  {
    MergeViews w;
    w.lb.device = Device{DeviceType::kCPU, 0};
    KF_EXPECT_INVALID(validate(w.t()), "lse_b must be on o_a's device (cuda:0), got cpu");
  }
  {
    MergeViews w;
    w.out = cuda_view(BF16, {8, 4, 128}, 0, (uintptr_t{1} << 40) + 256);  // inside o_a, not o_a itself
    KF_EXPECT_INVALID(validate(w.t()), "out overlaps o_a without being o_a itself");
  }
  {
    MergeViews w;
    w.out.strides[1] = 0;
    KF_EXPECT_INVALID(validate(w.t()), "out has overlapping elements");
  }
  {
    MergeViews w;
    w.out.dtype = F32;
    KF_EXPECT_INVALID(validate(w.t()), "out must have o_a's dtype (bfloat16), got float32");
  }
  {
    MergeViews w;
    w.lo = w.la;  // out_lse in place of lse_a: other threads of the row may still read it
    KF_EXPECT_INVALID(validate(w.t()), "out_lse must not overlap lse_a");
  }
  {
    MergeViews w;
    w.lo = cuda_view(F32, {4, 8}, 0, uintptr_t{6} << 40);
    KF_EXPECT_INVALID(validate(w.t()), "out_lse must have shape [8, 4]");
  }
  {
    MergeViews w;  // no rows: valid with any data pointer
    w.oa = cuda_view(BF16, {0, 4, 128}, 0, 0), w.ob = cuda_view(BF16, {0, 4, 128}, 0, 0);
    w.out = cuda_view(BF16, {0, 4, 128}, 0, 0), w.la = cuda_view(F32, {0, 4}, 0, 0);
    w.lb = cuda_view(F32, {0, 4}, 0, 0), w.lo = cuda_view(F32, {0, 4}, 0, 0);
    KF_ASSERT_OK(validate(w.t()));
  }
}

}  // namespace
