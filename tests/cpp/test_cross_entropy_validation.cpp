// Argument validation of the cross-entropy family: a bad call returns an InvalidArgument Status
// whose message names the op, the argument and what was expected (e.g. "cross_entropy: target must
// have shape [4] to match logits [4, 10], got [5]"), and nothing is launched.
//
// Validation runs before any device query or launch, so these tests need no GPU: the views point at
// dummy addresses that are never dereferenced (every call here fails validation). The workspace
// checks come after the device query: those tests skip without a GPU (and still launch nothing).
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::CrossEntropyOptions;
using kernelforge::Reduction;
using kernelforge::StatusCode;

constexpr DType F32 = DType::kFloat32;
constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType I64 = DType::kInt64;
constexpr DType I32 = DType::kInt32;

// A well-formed forward / backward call on dummy CUDA views (T = 4 rows, V = 10 classes); each test
// breaks one argument. Every view gets its own address, so nothing looks like an alias.
struct Call {
  int64_t t = 4, v = 10;
  CrossEntropyOptions o;
  TensorView logits, target, row_loss, lse, loss, valid, dloss, dlogits;
  void* ws = reinterpret_cast<void*>(uintptr_t{1} << 41);
  size_t ws_bytes = 1 << 20;

  explicit Call(DType dt = BF16, int64_t rows = 4, int64_t vocab = 10) : t(rows), v(vocab) {
    uintptr_t a = uintptr_t{1} << 40;
    auto next = [&]() { return a += uintptr_t{1} << 30; };
    logits = cuda_view(dt, {t, v}, 0, next());
    target = cuda_view(I64, {t}, 0, next());
    row_loss = cuda_view(F32, {t}, 0, next());
    lse = cuda_view(F32, {t}, 0, next());
    loss = cuda_view(F32, {}, 0, next());
    valid = cuda_view(F32, {}, 0, next());
    dloss = cuda_view(F32, {}, 0, next());
    dlogits = cuda_view(dt, {t, v}, 0, next());
  }
  Status fwd() const { return kf::cross_entropy(logits, target, o, row_loss, lse, loss, valid, ws, ws_bytes, nullptr); }
  Status bwd() const { return kf::cross_entropy_backward(dloss, logits, target, lse, valid, o, dlogits, nullptr); }
};

// ---- logits -------------------------------------------------------------------------------------

TEST(CeValidation, LogitsMustBe2D) {
  Call c;
  c.logits = cuda_view(BF16, {2, 2, 10});
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits must have shape [tokens, vocab] (2 dimensions), got [2, 2, 10]");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: logits must have shape [tokens, vocab]", "[2, 2, 10]");
  c.logits = cuda_view(BF16, {40});
  KF_EXPECT_INVALID(c.fwd(), "logits must have shape [tokens, vocab] (2 dimensions), got [40]");
  c.logits = cuda_view(BF16, {});
  KF_EXPECT_INVALID(c.fwd(), "logits must have shape [tokens, vocab] (2 dimensions), got []");
}

TEST(CeValidation, LogitsDtype) {
  Call c;
  c.logits = cuda_view(I32, {4, 10});
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits must be a float32/float16/bfloat16 tensor, got int32");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: logits must be a float32/float16/bfloat16 tensor, got int32");
  c.logits = cuda_view(I64, {4, 10});
  KF_EXPECT_INVALID(c.fwd(), "logits must be a float32/float16/bfloat16 tensor, got int64");
  c.logits = cuda_view(DType::kFloat64, {4, 10});  // float64 has no kernel: the reference takes it
  KF_EXPECT_INVALID(c.fwd(), "logits must be a float32/float16/bfloat16 tensor, got float64");
  c.logits = cuda_view(DType::kOther, {4, 10});
  KF_EXPECT_INVALID(c.fwd(), "logits must be a", "unsupported dtype");
  // the reference takes float64 but no integer logits
  HostTensor x(I64, {4, 10}), t(I64, {4}), rl(F32, {4}), l(F32, {4}), s(F32, {}), n(F32, {});
  KF_EXPECT_INVALID(ref::cross_entropy(x.view(), t.view(), c.o, rl.view(), l.view(), s.view(), n.view()),
                    "cross_entropy: logits must be a floating-point tensor, got int64");
}

TEST(CeValidation, LogitsDevice) {
  Call c;
  HostTensor hx(BF16, {4, 10});
  c.logits = hx.view();
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits must be a CUDA tensor, got a CPU tensor");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: logits must be a CUDA tensor");
  Call d;  // CUDA views handed to the CPU reference
  KF_EXPECT_INVALID(ref::cross_entropy(d.logits, d.target, d.o, d.row_loss, d.lse, d.loss, d.valid),
                    "cross_entropy: the reference takes CPU tensors, got logits on cuda:0");
  KF_EXPECT_INVALID(ref::cross_entropy_backward(d.dloss, d.logits, d.target, d.lse, d.valid, d.o, d.dlogits),
                    "cross_entropy_backward: the reference takes CPU tensors");
}

TEST(CeValidation, VocabZero) {
  Call c(F32, 4, 0);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits must have at least one class (vocab >= 1), got shape [4, 0]");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: logits must have at least one class");
  Call e(F32, 0, 0);  // no rows and no classes: still refused
  KF_EXPECT_INVALID(e.fwd(), "vocab >= 1", "[0, 0]");
}

TEST(CeValidation, VocabTooLarge) {
  Call c(F16, 1, int64_t{1} << 31);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits: vocab must be below 2^31, got 2147483648");
}

TEST(CeValidation, LogitsLastDimNotContiguous) {
  Call c(F32);
  c.logits.strides[1] = 2;
  c.logits.strides[0] = 20;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits must be contiguous in its last dimension (stride 1), got stride 2");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: logits must be contiguous in its last dimension");
}

TEST(CeValidation, LogitsRowStride) {
  Call c(F16);
  c.logits.strides[0] = -10;  // rows walking backwards
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits must not have negative strides");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: logits must not have negative strides");
}

TEST(CeValidation, LogitsNullData) {
  Call c;
  c.logits.data = nullptr;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: logits has a null data pointer");
}

TEST(CeValidation, TooManyRows) {
  // every row has at least one segment CTA (+1 for the grid bound): 2^30 rows x 2 > INT_MAX
  Call c(BF16, int64_t{1} << 30, 10);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: too many logits rows for one call (1073741824); split the call");
}

// ---- target -------------------------------------------------------------------------------------

TEST(CeValidation, TargetDtype) {
  Call c;
  c.target = cuda_view(F32, {4}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: target must be an int64 (or int32) tensor of class indices, got float32");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: target must be an int64 (or int32)", "got float32");
  c.target = cuda_view(F16, {4}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "target must be an int64 (or int32) tensor", "got float16");
  c.target = cuda_view(DType::kOther, {4}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "target must be an int64", "unsupported dtype");
}

TEST(CeValidation, TargetShape) {
  Call c;
  c.target = cuda_view(I64, {5}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: target must have shape [4] to match logits [4, 10], got [5]");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: target must have shape [4]", "got [5]");
  c.target = cuda_view(I32, {4, 1}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "target must have shape [4]", "got [4, 1]");
  c.target = cuda_view(I64, {}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "target must have shape [4]", "got []");
}

TEST(CeValidation, TargetDevice) {
  Call c;
  HostTensor ht(I64, {4});
  c.target = ht.view();
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: target must be on the same device as logits (cuda:0), got cpu");
  c.target = cuda_view(I64, {4}, 1, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(),
                    "cross_entropy_backward: target must be on the same device as logits (cuda:0), got cuda:1");
  c.target = cuda_view(I64, {4}, 0, 0);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: target has a null data pointer");
}

// ---- forward outputs ----------------------------------------------------------------------------

TEST(CeValidation, RowLossAndLseShape) {
  Call c;
  c.row_loss = cuda_view(F32, {5}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: row_loss must have shape [4], got [5]");
  c = Call();
  c.row_loss = cuda_view(F32, {4, 1}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "row_loss must have shape [4], got [4, 1]");
  c = Call();
  c.lse = cuda_view(F32, {}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: lse must have shape [4], got []");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: lse must have shape [4], got []");
}

TEST(CeValidation, RowLossAndLseDtype) {
  Call c;
  c.row_loss = cuda_view(BF16, {4}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: row_loss must be float32, got bfloat16");
  c = Call();
  c.lse = cuda_view(DType::kFloat64, {4}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: lse must be float32, got float64");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: lse must be float32, got float64");
}

TEST(CeValidation, RowLossAndLseContiguous) {
  Call c;
  c.row_loss.strides[0] = 2;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: row_loss must be contiguous, got stride 2");
  c = Call();
  c.lse.strides[0] = -1;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: lse must be contiguous, got stride -1");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: lse must be contiguous, got stride -1");
}

TEST(CeValidation, OutputDevicesAndNulls) {
  Call c;
  HostTensor h(F32, {4});
  c.row_loss = h.view();
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: row_loss must be on the same device as logits (cuda:0), got cpu");
  c = Call();
  c.lse = cuda_view(F32, {4}, 2, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "lse must be on the same device as logits (cuda:0), got cuda:2");
  c = Call();
  c.valid.data = nullptr;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: valid has a null data pointer");
  c = Call();
  c.loss.data = nullptr;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: loss has a null data pointer");
}

TEST(CeValidation, LossAndValidOneElement) {
  Call c;
  c.valid = cuda_view(F32, {2}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: valid must have one element, got shape [2]");
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: valid must have one element, got shape [2]");
  c = Call();
  c.loss = cuda_view(F32, {4}, 0, uintptr_t{3} << 40);  // a per-row loss passed as loss
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: loss must have one element, got shape [4]");
  c.o.reduction = Reduction::kSum;
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: loss must have one element, got shape [4]");
  c = Call();
  c.loss = cuda_view(F16, {}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: loss must be float32, got float16");
  c = Call();
  c.valid = cuda_view(I64, {1}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.fwd(), "cross_entropy: valid must be float32, got int64");
  // one element in any shape is fine: [1] and [1, 1] pass the checks of loss and valid
  HostTensor x(F32, {1, 3}), t(I64, {1}), rl(F32, {1}), l(F32, {1}), s(F32, {1, 1}), n(F32, {1});
  for (int64_t i = 0; i < 3; ++i) x.set(i, i);
  t.set(0, 2);
  KF_ASSERT_OK(ref::cross_entropy(x.view(), t.view(), c.o, rl.view(), l.view(), s.view(), n.view()));
}

// With Reduction::kNone the loss is not written, so it may be omitted (an empty view).
TEST(CeValidation, LossMayBeOmittedForNone) {
  HostTensor x(F32, {2, 3}), t(I64, {2}), rl(F32, {2}), l(F32, {2}), n(F32, {});
  for (int64_t i = 0; i < 6; ++i) x.set(i, 0.5 * i);
  t.set(0, 1);
  t.set(1, 0);
  CrossEntropyOptions o;
  o.reduction = Reduction::kNone;
  KF_ASSERT_OK(ref::cross_entropy(x.view(), t.view(), o, rl.view(), l.view(), TensorView{}, n.view()));
  o.reduction = Reduction::kMean;
  KF_EXPECT_INVALID(ref::cross_entropy(x.view(), t.view(), o, rl.view(), l.view(), TensorView{}, n.view()),
                    "cross_entropy: loss has a null data pointer");  // needed for mean
  // CUDA: an omitted loss passes validation; the call then stops at the device query (no GPU) or at
  // the missing workspace (GPU present), neither of which names the loss, and nothing is launched.
  Call c;
  c.o.reduction = Reduction::kNone;
  c.loss = TensorView{};
  c.ws = nullptr;
  c.ws_bytes = 0;
  const Status st = c.fwd();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().find("loss must"), std::string::npos) << st.message();
  if (gpu_count() > 0) {
    KF_EXPECT_INVALID(st, "workspace");
  }
}

// ---- backward -----------------------------------------------------------------------------------

TEST(CeValidation, DlossShapePerReduction) {
  Call c;
  c.o.reduction = Reduction::kNone;  // dloss [T]: a scalar is refused
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dloss must have shape [4], got []");
  c.dloss = cuda_view(F32, {5}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dloss must have shape [4], got [5]");
  c.dloss = cuda_view(F32, {4}, 0, uintptr_t{3} << 40);
  for (Reduction r : {Reduction::kMean, Reduction::kSum}) {  // dloss []: a [T] gradient is refused
    c.o.reduction = r;
    KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dloss must have one element, got shape [4]");
  }
  c.o.reduction = Reduction::kNone;
  c.dloss = cuda_view(F16, {4}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dloss must be float32, got float16");
  c.o.reduction = Reduction::kMean;
  c.dloss = cuda_view(BF16, {}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dloss must be float32, got bfloat16");
  c.dloss = cuda_view(F32, {}, 1, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "dloss must be on the same device as logits (cuda:0), got cuda:1");
}

// dloss [T] for kNone takes any stride (a column of a larger gradient): the reference accepts it.
TEST(CeValidation, DlossAnyStrideForNone) {
  HostTensor x(F32, {2, 3}), t(I64, {2}), rl(F32, {2}), l(F32, {2}), n(F32, {}), d(F32, {6}), dx(F32, {2, 3});
  for (int64_t i = 0; i < 6; ++i) {
    x.set(i, 0.25 * i);
    d.set(i, 1.0);
  }
  t.set(0, 2);
  t.set(1, 1);
  CrossEntropyOptions o;
  o.reduction = Reduction::kNone;
  KF_ASSERT_OK(ref::cross_entropy(x.view(), t.view(), o, rl.view(), l.view(), TensorView{}, n.view()));
  TensorView dv = d.view();
  dv.shape[0] = 2;
  dv.strides[0] = 3;
  KF_ASSERT_OK(ref::cross_entropy_backward(dv, x.view(), t.view(), l.view(), n.view(), o, dx.view()));
}

TEST(CeValidation, DlogitsShape) {
  Call c;
  c.dlogits = cuda_view(BF16, {4, 11}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits must have the shape of logits [4, 10], got [4, 11]");
  c.dlogits = cuda_view(BF16, {40}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "dlogits must have the shape of logits [4, 10], got [40]");
  c.dlogits = cuda_view(BF16, {1, 4, 10}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "dlogits must have the shape of logits [4, 10], got [1, 4, 10]");
}

TEST(CeValidation, DlogitsDtype) {
  Call c;
  c.dlogits = cuda_view(F32, {4, 10}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits must have the dtype of logits (bfloat16), got float32");
  Call f(F16);
  f.dlogits = cuda_view(BF16, {4, 10}, 0, uintptr_t{3} << 40);
  KF_EXPECT_INVALID(f.bwd(), "dlogits must have the dtype of logits (float16), got bfloat16");
}

TEST(CeValidation, DlogitsLayout) {
  Call c;
  c.dlogits.strides[1] = 2;
  c.dlogits.strides[0] = 20;
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits must be contiguous in its last dimension (stride 1)");
  c = Call();
  c.dlogits.strides[0] = 5;  // rows 5 apart but 10 long
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits rows overlap (row stride 5 < vocab)");
  c = Call();
  c.dlogits.strides[0] = -10;
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits must not have negative strides");
  c = Call();
  HostTensor h(BF16, {4, 10});
  c.dlogits = h.view();
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits must be on the same device as logits (cuda:0), got cpu");
  c = Call();
  c.dlogits.data = nullptr;
  KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: dlogits has a null data pointer");
}

// ---- options ------------------------------------------------------------------------------------

TEST(CeValidation, LabelSmoothingRange) {
  for (double e : {-0.1, 1.5, double(NAN), double(INFINITY)}) {
    SCOPED_TRACE(e);
    Call c;
    c.o.label_smoothing = e;
    KF_EXPECT_INVALID(c.fwd(), "cross_entropy: label_smoothing must be in [0, 1], got");
    KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: label_smoothing must be in [0, 1]");
  }
  Call c;
  c.o.label_smoothing = -0.25;
  KF_EXPECT_INVALID(c.fwd(), "label_smoothing must be in [0, 1], got -0.25");
}

TEST(CeValidation, VocabularyShardRange) {
  struct Bad {
    int64_t start, classes;
  };
  for (Bad b : {Bad{-1, 20}, Bad{11, 20}, Bad{0, 9}, Bad{5, -3}, Bad{1, 0}}) {  // vocab 10
    SCOPED_TRACE(std::to_string(b.start) + " of " + std::to_string(b.classes));
    Call c;
    c.o.class_start = b.start, c.o.num_classes = b.classes;
    KF_EXPECT_INVALID(c.fwd(), "cross_entropy: a vocabulary shard must lie inside the classes: class_start (");
    KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: a vocabulary shard must lie inside the classes");
  }
  Call c;
  c.o.class_start = 12, c.o.num_classes = 20;
  KF_EXPECT_INVALID(c.fwd(), "class_start (12) >= 0 and class_start + vocab (22) <= num_classes (20; 0 means vocab)");
}

TEST(CeValidation, ZLossScale) {
  for (double z : {-1e-4, double(INFINITY), double(NAN)}) {
    SCOPED_TRACE(z);
    Call c;
    c.o.z_loss_scale = z;
    KF_EXPECT_INVALID(c.fwd(), "cross_entropy: z_loss_scale must be finite and >= 0, got");
    KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: z_loss_scale must be finite and >= 0");
  }
}

TEST(CeValidation, Softcap) {
  for (double s : {-30.0, -1e-9, double(INFINITY), double(NAN)}) {
    SCOPED_TRACE(s);
    Call c;
    c.o.softcap = s;
    KF_EXPECT_INVALID(c.fwd(), "cross_entropy: softcap must be finite and > 0 (or 0 / None: no softcap), got");
    KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: softcap must be finite and > 0");
  }
}

TEST(CeValidation, BadReduction) {
  for (int r : {3, -1, 7}) {
    Call c;
    c.o.reduction = static_cast<Reduction>(r);
    KF_EXPECT_INVALID(
        c.fwd(), ("cross_entropy: reduction must be none (0), mean (1) or sum (2), got " + std::to_string(r)).c_str());
    KF_EXPECT_INVALID(c.bwd(), "cross_entropy_backward: reduction must be none (0), mean (1) or sum (2)");
  }
}

// The reference checks exactly what the CUDA entry points check (one validator), with the same
// messages: a few spot checks on host tensors.
TEST(CeValidation, ReferenceSharesTheChecks) {
  HostTensor x(F32, {4, 10}), t(I64, {5}), rl(F32, {4}), l(F32, {4}), s(F32, {}), n(F32, {});
  CrossEntropyOptions o;
  KF_EXPECT_INVALID(ref::cross_entropy(x.view(), t.view(), o, rl.view(), l.view(), s.view(), n.view()),
                    "cross_entropy: target must have shape [4] to match logits [4, 10], got [5]");
  HostTensor t4(I64, {4}), d(F32, {}), dx(F16, {4, 10});
  KF_EXPECT_INVALID(ref::cross_entropy_backward(d.view(), x.view(), t4.view(), l.view(), n.view(), o, dx.view()),
                    "cross_entropy_backward: dlogits must have the dtype of logits (float32), got float16");
  o.softcap = -1;
  KF_EXPECT_INVALID(ref::cross_entropy(x.view(), t4.view(), o, rl.view(), l.view(), s.view(), n.view()),
                    "cross_entropy: softcap must be finite and > 0");
}

// ---- workspace (checked after the device query: needs a GPU; nothing is launched) ---------------

TEST(CeValidation, WorkspaceTooSmallOrMisaligned) {
  for (DType dt : {F32, F16, BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Call c(dt, 3, 20000);
    const size_t need = kf::cross_entropy_workspace_size(3, 20000);
    ASSERT_GE(need, size_t{16});
    c.ws_bytes = 0;
    c.ws = nullptr;
    const Status st = c.fwd();
    if (gpu_count() == 0 && st.code() == StatusCode::kCudaError) GTEST_SKIP() << st.message();
    if (dt == BF16 && gpu_capability() < 80) continue;  // NotSupported before the workspace check
    KF_EXPECT_INVALID(st, "cross_entropy: workspace must hold at least", "(cross_entropy_workspace_size), got 0");
    c.ws = reinterpret_cast<void*>(uintptr_t{1} << 41);
    c.ws_bytes = 15;  // below any size (the header alone is 16 bytes)
    KF_EXPECT_INVALID(c.fwd(), "workspace must hold at least", "got 15");
    c.ws_bytes = 1 << 20;
    c.ws = reinterpret_cast<void*>((uintptr_t{1} << 41) + 8);
    KF_EXPECT_INVALID(c.fwd(), "cross_entropy: workspace must be 16-byte aligned");
  }
}

// The size covers the float32 segment count (the largest) and grows with rows and vocab.
TEST(CeValidation, WorkspaceSize) {
  EXPECT_GE(kf::cross_entropy_workspace_size(0, 100), size_t{16});
  EXPECT_LT(kf::cross_entropy_workspace_size(4, 8192), kf::cross_entropy_workspace_size(4, 8193));
  EXPECT_LT(kf::cross_entropy_workspace_size(4, 100), kf::cross_entropy_workspace_size(5, 100));
  // 16 bytes per (row, segment of 8192 float32 logits), at least
  EXPECT_GE(kf::cross_entropy_workspace_size(7, 128256), size_t{7 * 16 * 16});
}

}  // namespace
