// The PyTorch binding of the GEMM family (include/kernelforge/gemm.h): kernelforge::gemm, out = act(a b^T +
// bias) through cuBLASLt with the fused epilogue, optionally with the pre-activation (aux) and the row sums
// of a (a_sum, the bias gradient of a weight-gradient GEMM). CUDA = cuBLASLt (the core plans once per
// distinct problem), CPU = the float64 reference. No autograd of its own: kernelforge.linear
// (python/kernelforge/gemm.py) builds the layer's forward and backward from it. Fake impl: gemm.py.
//
// a [M, K] and b [N, K]: any strides with stride 1 along one dimension (a transposed view passes as is;
// other strides are copied to contiguous); bias [N] or None; out [M, N] contiguous in a's dtype; aux [M, N]
// and a_sum [M] when asked, else empty. Batched: a [B, M, K] and/or b [B, N, K] (a 2-D operand is shared by
// every batch), out and aux [B, M, N].
#include <string>
#include <tuple>
#include <vector>

#include "kernelforge/gemm.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

const EnumName<kf::GemmActivation> kActivations[] = {{"none", kf::GemmActivation::kNone},
                                                     {"relu", kf::GemmActivation::kRelu},
                                                     {"gelu_tanh", kf::GemmActivation::kGeluTanh}};

// An operand as the core takes it: its matrices with stride 1 along one dimension, else a contiguous copy.
Tensor operand(const Tensor& t) {
  const bool row = t.size(-1) <= 1 || t.stride(-1) == 1, col = t.size(-2) <= 1 || t.stride(-2) == 1;
  return row || col ? t : t.contiguous();
}

std::tuple<Tensor, Tensor, Tensor> gemm_impl(bool cuda, const Tensor& a_in, const Tensor& b_in, const OptTensor& bias,
                                             c10::string_view activation, bool want_aux, bool want_sum) {
  const kf::GemmActivation act = parse_enum("gemm", "activation", activation, kActivations);
  if (cuda && needs_fallback("gemm", a_in)) {
    auto r = gemm_impl(false, a_in.cpu(), b_in.cpu(), to_cpu(bias), activation, want_aux, want_sum);
    return {std::get<0>(r).to(a_in.device()), std::get<1>(r).to(a_in.device()), std::get<2>(r).to(a_in.device())};
  }
  if (a_in.dim() != 2 && a_in.dim() != 3)
    TORCH_CHECK_VALUE(false, "gemm: a must have 2 dimensions [M, K] or 3 [B, M, K], got " + std::to_string(a_in.dim()));
  if (b_in.dim() != 2 && b_in.dim() != 3)
    TORCH_CHECK_VALUE(false, "gemm: b must have 2 dimensions [N, K] or 3 [B, N, K], got " + std::to_string(b_in.dim()));
  const Tensor a = operand(a_in), b = operand(b_in);
  const int64_t m = a.size(-2), n = b.size(-2);
  // Batched when either operand is: out [B, M, N], B from the 3-D operand(s) (the core checks they agree).
  std::vector<int64_t> shape{m, n};
  if (a.dim() == 3 || b.dim() == 3) shape.insert(shape.begin(), a.dim() == 3 ? a.size(0) : b.size(0));
  Tensor out = at::empty(shape, a.options());
  Tensor aux = want_aux ? at::empty(shape, a.options()) : at::empty({0, 0}, a.options());
  Tensor sum = at::empty({want_sum ? m : 0}, a.options());
  const kf::TensorView av = view(a), bv = view(b), ov = view(out), xv = view(aux), sv = view(sum);
  const OptView biv(bias);
  kf::GemmTensors t;
  t.a = &av;
  t.b = &bv;
  t.bias = biv.get();
  t.out = &ov;
  t.aux = want_aux ? &xv : nullptr;
  t.a_sum = want_sum ? &sv : nullptr;
  if (!cuda) {
    check(kf::ref::gemm(t, act));
    return {out, aux, sum};
  }
  c10::cuda::CUDAGuard guard(a.device());
  // Plan (host only; cuBLASLt's heuristic once per distinct problem), then its workspace from the
  // caching allocator (its blocks are 512-byte aligned, the core asks 256): stream-ordered, no host
  // synchronization, so a CUDA graph captures the call.
  kf::GemmPlan plan;
  size_t bytes = 0;
  check(kf::gemm_plan(t, act, &plan, &bytes));
  Tensor ws = bytes > 0 ? workspace(a, bytes) : Tensor();
  check(kf::gemm(plan, t, act, bytes > 0 ? ws.data_ptr() : nullptr, bytes, stream_of(a)));
  return {out, aux, sum};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&gemm_impl>(m,
                     "gemm(Tensor a, Tensor b, Tensor? bias=None, str activation=\"none\", bool aux=False, "
                     "bool a_sum=False) -> (Tensor, Tensor, Tensor)");
}
