// The PyTorch binding of the dropout family (include/kernelforge/dropout.h): dropout, dropout_add and
// their backward. CUDA = our kernels, CPU = the float64 reference. The random stream comes from a
// torch generator: CUDA tensors take the given CUDA generator or the device's default one (its
// philox_cuda_state: values, or device pointers under CUDA-graph capture); CPU tensors take a CUDA
// generator the same way (the masks a CUDA call with it would give) or a CPU generator's next 64
// random bits as the seed at offset 0. Autograd and fake impls: python/kernelforge/dropout.py.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxCudaState.h>

#include <mutex>
#include <optional>
#include <tuple>

#include "kernelforge/dropout.h"
#include "kf_common.h"

namespace {

using namespace kftorch;
using OptGenerator = std::optional<at::Generator>;

// 32-bit values one call takes from the generator's offset: each group of 8 elements (a Philox
// subsequence, 16 bits per element) uses the one counter at offset / 4, i.e. 4 values, and never a
// counter of another call or of PyTorch's own random ops (which take [offset, offset + increment)
// for every subsequence). A multiple of 4, as philox_cuda_state requires.
constexpr uint64_t kPhiloxIncrement = 4;

kf::PhiloxState from_cuda_generator(at::CUDAGeneratorImpl* gen) {
  at::PhiloxCudaState s;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    s = gen->philox_cuda_state(kPhiloxIncrement);
  }
  kf::PhiloxState r;
  r.captured = s.captured_;
  if (s.captured_) {
    r.seed_ptr = s.seed_.ptr;
    r.offset_ptr = s.offset_.ptr;
    r.offset_intragraph = s.offset_intragraph_;
  } else {
    r.seed = s.seed_.val;
    r.offset = s.offset_.val;
  }
  return r;
}

// The stream of one call on x (p in (0, 1): p = 0 and p = 1 draw nothing, like F.dropout).
kf::PhiloxState next_state(const char* op, const Tensor& x, const OptGenerator& gen) {
  if (x.is_cuda()) {
    TORCH_CHECK_VALUE(!gen.has_value() || !gen->defined() || gen->device().is_cuda(), op,
                      ": generator must be a CUDA generator for CUDA tensors, got a ", gen->device().str(),
                      " generator");
    auto* g = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        gen, at::cuda::detail::getDefaultCUDAGenerator(x.device().index()));
    return from_cuda_generator(g);
  }
  if (gen.has_value() && gen->defined() && gen->device().is_cuda()) {
    kf::PhiloxState s = from_cuda_generator(gen->get<at::CUDAGeneratorImpl>());
    TORCH_CHECK(!s.captured, op, ": a CUDA generator under CUDA-graph capture cannot drive CPU tensors");
    return s;
  }
  auto* g = at::get_generator_or_default<at::CPUGeneratorImpl>(gen, at::detail::getDefaultCPUGenerator());
  kf::PhiloxState s;
  std::lock_guard<std::mutex> lock(g->mutex_);
  s.seed = g->random64();
  return s;
}

bool draws(double p) { return p > 0.0 && p < 1.0; }

// The float64-on-CUDA fallback draws from the CUDA generator too (torch.manual_seed reproduces it).
OptGenerator cuda_generator(const Tensor& x, const OptGenerator& gen) {
  if (gen.has_value() && gen->defined()) return gen;
  return at::cuda::detail::getDefaultCUDAGenerator(x.device().index());
}

// The contiguous form the kernels take (a copy for any other layout).
Tensor dense_input(const Tensor& t) { return t.contiguous(); }

Tensor state_like(const Tensor& x) { return at::empty({2}, x.options().dtype(at::kLong)); }

std::tuple<Tensor, Tensor, Tensor> dropout_impl(bool cuda, const Tensor& x_in, double p, OptGenerator gen,
                                                bool return_mask) {
  if (cuda && needs_fallback("dropout", x_in)) {
    auto [y, st, m] = dropout_impl(false, x_in.cpu(), p, cuda_generator(x_in, gen), return_mask);
    return {y.to(x_in.device()), st.to(x_in.device()), m.to(x_in.device())};
  }
  const Tensor x = dense_input(x_in);
  Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  Tensor st = state_like(x);
  Tensor mask = at::empty(return_mask ? x.sizes() : at::IntArrayRef{0}, x.options().dtype(at::kBool));
  const kf::TensorView sv = view(st);
  uint8_t* m = return_mask && x.numel() > 0 ? static_cast<uint8_t*>(mask.data_ptr()) : nullptr;
  kf::PhiloxState rng;
  if (x.numel() == 0) {
    st.zero_();  // no kernel runs: the state is (0, 0)
  } else if (p >= 0.0 && p <= 1.0 && draws(p)) {
    rng = next_state("dropout", x, gen);
  }
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::dropout(view(x), p, rng, view(y), &sv, m, stream_of(x)));
  } else {
    check(kf::ref::dropout(view(x), p, rng, view(y), &sv, m));
  }
  return {y, st, mask};
}

std::tuple<Tensor, Tensor> dropout_add_impl(bool cuda, const Tensor& x_in, const Tensor& r_in, double p,
                                            OptGenerator gen) {
  if (cuda && needs_fallback("dropout_add", x_in)) {
    auto [y, st] = dropout_add_impl(false, x_in.cpu(), r_in.cpu(), p, cuda_generator(x_in, gen));
    return {y.to(x_in.device()), st.to(x_in.device())};
  }
  const Tensor x = dense_input(x_in), r = dense_input(r_in);
  Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  Tensor st = state_like(x);
  const kf::TensorView sv = view(st);
  kf::PhiloxState rng;
  if (x.numel() == 0) {
    st.zero_();
  } else if (p >= 0.0 && p <= 1.0 && draws(p)) {
    rng = next_state("dropout_add", x, gen);
  }
  if (cuda) {
    c10::cuda::CUDAGuard guard(x.device());
    check(kf::dropout_add(view(x), view(r), p, rng, view(y), &sv, stream_of(x)));
  } else {
    check(kf::ref::dropout_add(view(x), view(r), p, rng, view(y), &sv));
  }
  return {y, st};
}

Tensor dropout_backward_impl(bool cuda, const Tensor& dy_in, const Tensor& rng_state, double p) {
  if (cuda && needs_fallback("dropout_backward", dy_in))
    return dropout_backward_impl(false, dy_in.cpu(), rng_state.cpu(), p).to(dy_in.device());
  const Tensor dy = dense_input(dy_in);
  Tensor dx = at::empty_like(dy, at::MemoryFormat::Contiguous);
  if (cuda) {
    c10::cuda::CUDAGuard guard(dy.device());
    check(kf::dropout_backward(view(dy), view(rng_state), p, view(dx), stream_of(dy)));
  } else {
    check(kf::ref::dropout_backward(view(dy), view(rng_state), p, view(dx)));
  }
  return dx;
}

// def_op's registration with the nondeterministic_seeded tag: the forward ops draw from a generator,
// so tracers must neither merge two calls nor replay one.
template <auto kImpl>
void def_random_op(torch::Library& m, const char* schema) {
  m.def(schema, {at::Tag::pt2_compliant_tag, at::Tag::nondeterministic_seeded});
  const std::string name = op_name(schema);
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CUDA, Kernels<kImpl>::cuda));
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CPU, Kernels<kImpl>::cpu));
}

}  // namespace

// rng_state: int64 [2] = the (seed, offset) the forward used, on x's device; the backward reads it.
// mask: bool of x's shape when return_mask, else empty.
TORCH_LIBRARY_FRAGMENT(kernelforge, m) {
  def_random_op<&dropout_impl>(m,
                               "dropout(Tensor x, float p=0.5, Generator? generator=None, bool return_mask=False) -> "
                               "(Tensor y, Tensor rng_state, Tensor mask)");
  def_random_op<&dropout_add_impl>(
      m,
      "dropout_add(Tensor x, Tensor residual, float p=0.5, Generator? generator=None) -> (Tensor y, Tensor rng_state)");
  def_op<&dropout_backward_impl>(m, "dropout_backward(Tensor dy, Tensor rng_state, float p) -> Tensor dx");
}
