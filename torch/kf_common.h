// What every binding file (torch/kf_<family>.cpp) shares: tensor -> TensorView, Status -> error,
// the current stream, row views, the float64 CUDA fallback, string enums, the autograd conventions,
// and def_op, which registers an op's schema and its CUDA, CPU and autograd kernels in one place.
// The binding is the only code that includes torch headers; every argument check lives in the core.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kftorch {

namespace kf = kernelforge;
using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- tensors -> views ----------------------------------------------------------------------------
kf::DType to_dtype(at::ScalarType t);
kf::TensorView view(const Tensor& t);

inline bool defined(const OptTensor& t) { return t.has_value() && t->defined(); }

struct OptView {  // a view that may be absent
  kf::TensorView v;
  bool present = false;
  explicit OptView(const OptTensor& t) {
    if (defined(t)) {
      v = view(*t);
      present = true;
    }
  }
  const kf::TensorView* get() const { return present ? &v : nullptr; }
};

inline void check(const kf::Status& s) { TORCH_CHECK(s.ok(), s.message()); }
// "[4, 8]": a shape for error messages, passed to TORCH_CHECK as a string. On the GPU machine (GCC 13
// build, torch 2.11) a TORCH_CHECK message that streams an int64_t or an IntArrayRef crashed the
// process (SIGSEGV) instead of raising; strings and const char* are fine, so numbers go through
// std::to_string and shapes through this.
inline std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// Leading dims that do not collapse into one row stride are copied (the kernels take one row
// stride); a non-contiguous last dimension is left for the core to reject with a clear message.
Tensor rows(const Tensor& t);

inline Tensor empty_like_rows(const Tensor& x) { return at::empty(x.sizes(), x.options()); }
// The gradient buffer of an optional parameter: its shape, or an empty [0] tensor when absent.
inline Tensor empty_param(const OptTensor& p, const Tensor& x) {
  return defined(p) ? at::empty(p->sizes(), p->options()) : at::empty({0}, x.options());
}
inline Tensor workspace(const Tensor& x, size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes < 16 ? 16 : bytes)}, x.options().dtype(at::kByte));
}

inline cudaStream_t stream_of(const Tensor& x) { return at::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

// float64 (which our kernels do not take) on CUDA: the float64 CPU reference runs instead, once
// warned; KF_STRICT=1 makes it an error. Never silent.
bool needs_fallback(const char* op, const Tensor& x);
inline OptTensor to_cpu(const OptTensor& t) { return defined(t) ? OptTensor(t->cpu()) : t; }

// ---- enums as strings ----------------------------------------------------------------------------
template <typename E>
struct EnumName {
  const char* name;
  E value;
};

// "'a' or 'b'", "'a', 'b' or 'c'"
template <typename E, size_t N>
std::string enum_names(const EnumName<E> (&names)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += std::string(i == 0 ? "'" : (i + 1 == N ? " or '" : ", '")) + names[i].name + "'";
  return s;
}

// The enumerator named `s`; otherwise a ValueError "<op>: <arg> must be 'a' or 'b', got 'c'".
template <typename E, size_t N>
E parse_enum(const char* op, const char* arg, c10::string_view s, const EnumName<E> (&names)[N]) {
  for (const EnumName<E>& n : names)
    if (s == n.name) return n.value;
  TORCH_CHECK_VALUE(false, op, ": ", arg, " must be ", enum_names(names), ", got '", std::string(s), "'");
}

// ---- autograd conventions ------------------------------------------------------------------------
// Backward ops are called through the dispatcher, so that torch.compile and other tracers see them.
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

inline Tensor grad_or_empty(bool want, const Tensor& g) { return want && g.numel() > 0 ? g : Tensor(); }
inline OptTensor saved_opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The backward ops have no autograd of their own: under create_graph=True (double backward, e.g. a
// gradient penalty) their outputs would carry no graph and the second derivatives would silently be
// zero. The engine runs backward with grad mode on exactly then, so that case is an error.
void no_double_backward(const char* op);

// Autograd may hand an expanded gradient (e.g. of y.sum(): stride 0); the kernels need a contiguous
// last dimension.
inline Tensor dense(const Tensor& g) { return g.dim() > 0 && g.size(-1) > 1 && g.stride(-1) != 1 ? g.contiguous() : g; }

// ---- one op, one place ---------------------------------------------------------------------------
// Kernels<impl>: the CUDA and CPU kernels of an op. An impl `R f(bool cuda, Args...)` serves both
// keys (cuda = our kernels, otherwise the float64 reference); any other impl reads the device from
// its tensors and is registered as it is for both.
template <auto kImpl>
struct Kernels {
  static constexpr auto cuda = kImpl;
  static constexpr auto cpu = kImpl;
};
template <typename R, typename... Args, R (*kImpl)(bool, Args...)>
struct Kernels<kImpl> {
  static R cuda(Args... args) { return kImpl(true, args...); }
  static R cpu(Args... args) { return kImpl(false, args...); }
};

std::string op_name(const char* schema);  // "rms_norm(Tensor x, ...) -> Tensor" -> "rms_norm"

// def_op<impl>(m, schema) or def_op<impl, autograd>(m, schema): the schema (pt2-compliant), the
// CUDA and CPU kernels from `impl`, and the Autograd kernel when the op's autograd lives in C++.
// The dispatcher checks each function's C++ signature against the schema when it is registered.
template <auto kImpl, auto... kAutograd>
void def_op(torch::Library& m, const char* schema) {
  static_assert(sizeof...(kAutograd) <= 1, "one autograd kernel per op");
  m.def(schema, {at::Tag::pt2_compliant_tag});
  const std::string name = op_name(schema);
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CUDA, Kernels<kImpl>::cuda));
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CPU, Kernels<kImpl>::cpu));
  (m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd, kAutograd)), ...);
}

}  // namespace kftorch
