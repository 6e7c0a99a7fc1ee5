// The PyTorch binding of the grouped_mm family (include/kernelforge/grouped_mm.h): grouped_mm (out rows of
// group e = x_e w[e]^T) and grouped_mm_wgrad (dw[e] = dy_e^T x_e). CUDA = our kernels (the wgmma kernel on
// sm_90, the portable one elsewhere), CPU = the float64 reference. Fake impls and autograd:
// python/kernelforge/grouped_mm.py.
//
// x / dy: row-major with any row stride (other layouts are copied to contiguous); w [E, N, K]: matrices
// with stride 1 along K or N as given (a transposed view of a [E, K, N] stack passes as is), others are
// copied; offsets int32 [E]. Outputs are contiguous. The workspace comes from the caching allocator:
// stream-ordered, no host synchronization, so a CUDA graph captures the call.
#include "kernelforge/grouped_mm.h"
#include "kf_common.h"

namespace {

using namespace kftorch;

Tensor row_major(const Tensor& t) { return t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) ? t : t.contiguous(); }

Tensor weights(const Tensor& w) {
  if (w.dim() != 3) return w;  // the core names the shape it expects
  const bool k_fast = w.size(2) <= 1 || w.stride(2) == 1, n_fast = w.size(1) <= 1 || w.stride(1) == 1;
  return k_fast || n_fast ? w : w.contiguous();
}

using CudaEntry = kf::Status (*)(const kf::TensorView&, const kf::TensorView&, const kf::TensorView&,
                                 const kf::TensorView&, void*, size_t*, cudaStream_t);
using RefEntry = kf::Status (*)(const kf::TensorView&, const kf::TensorView&, const kf::TensorView&,
                                const kf::TensorView&);

// One call of either op into `out`: the float64 reference on the CPU; on CUDA the workspace size, the
// workspace from the caching allocator, then the call on the current stream.
void run(bool cuda, CudaEntry entry, RefEntry ref, const Tensor& a, const Tensor& b, const Tensor& offsets,
         const Tensor& out) {
  if (!cuda) {
    check(ref(view(a), view(b), view(offsets), view(out)));
    return;
  }
  c10::cuda::CUDAGuard guard(a.device());
  size_t bytes = 0;
  check(entry(view(a), view(b), view(offsets), view(out), nullptr, &bytes, nullptr));
  Tensor ws = workspace(a, bytes);
  check(entry(view(a), view(b), view(offsets), view(out), ws.data_ptr(), &bytes, stream_of(a)));
}

Tensor grouped_mm_impl(bool cuda, const Tensor& x_in, const Tensor& w_in, const Tensor& offsets) {
  if (cuda && needs_fallback("grouped_mm", x_in))
    return grouped_mm_impl(false, x_in.cpu(), w_in.cpu(), offsets.cpu()).to(x_in.device());
  const Tensor x = row_major(x_in), w = weights(w_in);
  Tensor out = at::empty({x.dim() == 2 ? x.size(0) : 0, w.dim() == 3 ? w.size(1) : 0}, x.options());
  run(cuda, &kf::grouped_mm, &kf::ref::grouped_mm, x, w, offsets, out);
  return out;
}

Tensor grouped_mm_wgrad_impl(bool cuda, const Tensor& dy_in, const Tensor& x_in, const Tensor& offsets) {
  if (cuda && needs_fallback("grouped_mm_wgrad", x_in))
    return grouped_mm_wgrad_impl(false, dy_in.cpu(), x_in.cpu(), offsets.cpu()).to(x_in.device());
  const Tensor dy = row_major(dy_in), x = row_major(x_in);
  const int64_t e = offsets.dim() == 1 ? offsets.size(0) : 0;
  Tensor dw = at::empty({e, dy.dim() == 2 ? dy.size(1) : 0, x.dim() == 2 ? x.size(1) : 0}, x.options());
  run(cuda, &kf::grouped_mm_wgrad, &kf::ref::grouped_mm_wgrad, dy, x, offsets, dw);
  return dw;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_op<&grouped_mm_impl>(m, "grouped_mm(Tensor x, Tensor w, Tensor offsets) -> Tensor");
  def_op<&grouped_mm_wgrad_impl>(m, "grouped_mm_wgrad(Tensor dy, Tensor x, Tensor offsets) -> Tensor");
}
