// The cross-entropy planner (see cross_entropy_plan.h): the read path from the rows' alignment, the
// grid from the rows and the vocabulary.
#include "cross_entropy/cross_entropy_plan.h"

#include <cstdint>

#include "common/align.h"
#include "common/math.h"

namespace kernelforge {

namespace {

// The read paths, best first. Each row: when it applies and why it is there.
struct CePath {
  bool vectors;      // 16-byte vectors (else one element per access)
  bool scalar_head;  // a scalar head first
};
constexpr CePath kCePaths[] = {
    // Aligned rows: 16-byte vectors from the row start. The forward reads 4096 x 128256 bf16 logits
    // (1.05 GB) in 356 us on the H100 (2950 GB/s), the backward reads and writes them once.
    {true, false},
    // Rows not 16-byte aligned (an odd vocabulary with contiguous logits): the first hd < 16 bytes
    // of a row by hd threads of the row's first CTA, 16-byte vectors after. H100, bf16, fwd / fwd+bwd:
    // 8192 x 32001 2635 / 2844 GB/s where one element per access gave ~1909 fwd+bwd; aligned
    // 8192 x 32000: 2769 / 2947.
    {true, true},
    // Anything else (the backward's logits and dlogits misaligned differently): one element per
    // access, correct at any layout.
    {false, false},
};

bool path_fits(const CePath& path, const CeProblem& pr) {
  if (!path.vectors) return true;
  return path.scalar_head ? pr.head_ok : pr.aligned;
}

CePlan with_path(const CePath& path, const CeProblem& pr) {
  CePlan p;
  p.kind = pr.backward ? CeKernel::kBackward : CeKernel::kForward;
  p.vec = path.vectors ? 16 / pr.elem_bytes : 1;
  p.scalar_head = path.scalar_head;
  if (pr.backward) {
    p.segments = int(ceil_div(pr.vocab, int64_t(kCeThreads) * kCeBwdIters * p.vec));
    p.finalize_blocks = 0;
  } else {
    p.segments = int(ceil_div(pr.vocab, ce_segment_elems(pr.elem_bytes)));
    p.finalize_blocks = ceil_div(pr.rows, kCeFinalizeBlock);
  }
  p.grid = pr.rows * p.segments;
  return p;
}

}  // namespace

std::string to_string(const CePlan& plan) {
  std::string s;
  switch (plan.kind) {
    case CeKernel::kForward:
      s = "ce_fwd";
      break;
    case CeKernel::kBackward:
      s = "ce_bwd";
      break;
    default:
      s = "ce_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  s += " vec=" + std::to_string(plan.vec) + " head=" + std::to_string(int(plan.scalar_head)) +
       (plan.kind == CeKernel::kBackward ? " tiles=" : " segments=") + std::to_string(plan.segments) +
       " grid=" + std::to_string(plan.grid);
  if (plan.kind != CeKernel::kBackward) s += " finalize=" + std::to_string(plan.finalize_blocks);
  return s;
}

// Aligned: the logits (and dlogits) base pointers are 16-byte aligned and their row strides a
// multiple of 16 bytes. Head: the logits pointer is element-aligned and, in the backward, dlogits
// shares the logits' misalignment (base pointers and row strides differ by multiples of 16 bytes;
// in place always does).
CeProblem make_ce_problem(const CeParams& p, bool backward, int elem_bytes) {
  auto aligned = [&](const void* ptr, int64_t ld) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && ld % (16 / elem_bytes) == 0;
  };
  CeProblem pr;
  pr.backward = backward;
  pr.elem_bytes = elem_bytes;
  pr.rows = p.rows;
  pr.vocab = p.vocab;
  pr.aligned = aligned(p.logits, p.ld) && (!backward || aligned(p.dlogits, p.dld));
  pr.head_ok = reinterpret_cast<uintptr_t>(p.logits) % uintptr_t(elem_bytes) == 0 &&
               (!backward || shares_misalignment(p.logits, p.dlogits, (p.dld - p.ld) * int64_t(elem_bytes)));
  return pr;
}

CePlan plan_cross_entropy(const CeProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  for (const CePath& path : kCePaths)
    if (path_fits(path, pr)) return with_path(path, pr);
  return with_path(kCePaths[2], pr);
}

std::vector<CePlan> candidate_plans(const CeProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  std::vector<CePlan> plans;
  if (pr.vocab <= 0 || (pr.backward && pr.rows <= 0)) return plans;
  for (const CePath& path : kCePaths)
    if (path_fits(path, pr)) plans.push_back(with_path(path, pr));
  return plans;
}

Status check_plan(const CePlan& plan, const CeProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  auto fail = [&](const std::string& why) {
    return Status::Invalid("cross_entropy plan " + to_string(plan) + ": " + why);
  };
  if (plan.kind != CeKernel::kForward && plan.kind != CeKernel::kBackward) return fail("unknown kernel");
  if (plan.kind != (pr.backward ? CeKernel::kBackward : CeKernel::kForward))
    return fail(std::string("the problem is a ") + (pr.backward ? "backward" : "forward") + " call");
  if (pr.vocab <= 0 || (pr.backward && pr.rows <= 0)) return fail("the problem is empty: nothing to launch");
  const int wide = 16 / pr.elem_bytes;
  if (plan.vec != wide && plan.vec != 1) return fail("vec must be 1 or 16 bytes of elements");
  if (plan.vec == 1 && plan.scalar_head) return fail("the scalar head is built for the 16-byte path only");
  const CePath path = {plan.vec == wide, plan.scalar_head};
  if (!path_fits(path, pr))
    return fail(plan.scalar_head ? "the rows do not share one misalignment that a scalar head can fix"
                                 : "16-byte vectors need 16-byte aligned rows");
  const CePlan want = with_path(path, pr);
  if (plan.segments != want.segments)
    return fail(std::string(pr.backward ? "tiles" : "segments") + " must be " + std::to_string(want.segments) +
                " for a vocabulary of " + std::to_string(pr.vocab));
  if (plan.grid != want.grid) return fail("grid must be rows x segments = " + std::to_string(want.grid));
  if (plan.grid > 2147483647) return fail("the grid exceeds 2^31 - 1 CTAs");
  if (plan.finalize_blocks != want.finalize_blocks)
    return fail("finalize blocks must be " + std::to_string(want.finalize_blocks));
  return Status::Ok();
}

}  // namespace kernelforge
