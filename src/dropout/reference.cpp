// float64 CPU reference of the dropout family: the test oracle and the CPU implementation of the
// PyTorch ops. The same Philox (kernels/philox.h) and keep rule as the kernels, the formulas of
// dropout.h in double (scale 1 / (1 - p) in double), every output rounded once to its dtype.
#include "common/host_convert.h"
#include "dropout/dropout_problem.h"
#include "dropout/kernels/philox.h"

namespace kernelforge {
namespace ref {

namespace {

Status run(const DropCall& c) {
  DropParams p;
  DType t;
  Status s = validate_dropout(c, &p, &t);
  if (!s.ok()) return s;
  if (p.rng_out != nullptr) {
    p.rng_out[0] = int64_t(p.rng.seed);
    p.rng_out[1] = int64_t(p.rng.offset);
  }
  const double scale = c.p < 1.0 ? 1.0 / (1.0 - c.p) : 0.0;
  constexpr int kG = philox::kGroupElems;
  philox::Block b{};
  for (int64_t i = 0; i < p.numel; ++i) {
    if (i % kG == 0) b = philox::dropout_group(p.rng.seed, p.rng.offset, uint64_t(i) / kG);
    const bool keep = philox::bits16(b, int(i % kG)) < p.keep.threshold;
    const double f = keep ? scale : 0.0;
    const double x = load_as_double(p.in, t, i);
    const double v = p.add != nullptr ? load_as_double(p.add, t, i) + x * f : x * f;
    store_from_double(p.out, t, i, v);
    if (p.mask != nullptr) p.mask[i] = keep ? 1 : 0;
  }
  return Status::Ok();
}

DropCall make(const char* name, DropOp op, double p) {
  DropCall c;
  c.name = name;
  c.op = op;
  c.p = p;
  c.cuda = false;
  return c;
}

}  // namespace

Status dropout(const TensorView& x, double p, const PhiloxState& rng, const TensorView& y, const TensorView* rng_state,
               uint8_t* mask) {
  DropCall c = make("dropout", DropOp::kDropout, p);
  c.x = &x, c.y = &y, c.rng = rng, c.rng_state = rng_state, c.mask = mask;
  return run(c);
}

Status dropout_add(const TensorView& x, const TensorView& residual, double p, const PhiloxState& rng,
                   const TensorView& y, const TensorView* rng_state) {
  DropCall c = make("dropout_add", DropOp::kDropoutAdd, p);
  c.x = &x, c.residual = &residual, c.y = &y, c.rng = rng, c.rng_state = rng_state;
  return run(c);
}

Status dropout_backward(const TensorView& dy, const TensorView& rng_state, double p, const TensorView& dx) {
  DropCall c = make("dropout_backward", DropOp::kBackward, p);
  c.dy = &dy, c.rng_state = &rng_state, c.dx = &dx;
  return run(c);
}

uint32_t dropout_bits(uint64_t seed, uint64_t offset, int64_t i) {
  constexpr int kG = philox::kGroupElems;
  return philox::bits16(philox::dropout_group(seed, offset, uint64_t(i) / kG), int(i % kG));
}

bool dropout_keep(uint64_t seed, uint64_t offset, int64_t i, double p) {
  return dropout_bits(seed, offset, i) < keep_rule(p).threshold;
}

}  // namespace ref
}  // namespace kernelforge
