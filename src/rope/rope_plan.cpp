// The RoPE planner (see rope_plan.h): the vector width from the alignment, the kernel from the token
// count, the block shape from the units and heads of a token.
#include "rope/rope_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

namespace {

// Up to kRopeFlatMaxTokens tokens (decode steps) the flat kernel runs. The token kernel loads a
// token's cos/sin before its head loop, so its x loads wait for them: two memory round trips; the
// flat kernel issues both together. H100, bf16, 32/8 heads of 128, CUDA-graph replay, L2 hot, us per
// call (flat / token): 1 token 1.43 / 1.93, 64: 1.65 / 2.06, 256: 2.70 / 2.77, 512: 3.58 / 4.54,
// 1024: 5.86 / 6.68, 4096: 32.0 / 32.3.
constexpr int64_t kRopeFlatMaxTokens = 1024;

// Token kernel: heads per thread. From kRopeFewTokens tokens a thread takes at least
// kRopePrefillHeadsPerThread heads (in rounds of the kernel's 4 heads in flight): more bytes per
// thread and several tokens per block. H100, bf16, 40 heads of 128, 16384 tokens: 1 head per thread
// (160-thread blocks of one token) 2610 GB/s, 8 heads 2762 GB/s rotate-half, 2741 interleaved.
// Under it (short calls) a thread takes as few heads as fit the block, for latency.
constexpr int64_t kRopeFewTokens = 1024;
constexpr int kRopePrefillHeadsPerThread = 8;
constexpr int kRopeMaxBlockZ = 64;             // CUDA's limit for blockDim.z
constexpr int64_t kRopeMaxGrid = 1 << 30;      // token kernel blocks; more tokens loop
constexpr int kRopeMaxGridY = 65535;           // CUDA's limit for gridDim.y (flat: head groups)
constexpr int64_t kRopeMaxGridX = 2147483647;  // CUDA's limit for gridDim.x (flat: tokens)

// Rotation and passthrough units of one head at vector width `vec`.
void units_of(const RopeProblem& pr, int vec, int* units_rot, int* units) {
  const int R = pr.rot_dim, D = pr.head_dim;
  const bool split_scalar = pr.interleaved && vec == 1;  // interleaved pairs of single elements
  *units_rot = pr.interleaved ? (split_scalar ? R / 2 : R / vec) : (R / 2) / vec;
  const int units_pass = pr.all_inplace ? 0 : int(ceil_div(D - R, vec));
  *units = *units_rot + units_pass;
}

// Token kernel: tx threads over the units, ty head slots of at least `min_hpt` heads per thread
// (balanced), tz tokens to fill kRopeThreads.
RopePlan token_plan(const RopeProblem& pr, int vec, int min_hpt) {
  RopePlan p;
  p.kind = RopeKernel::kToken;
  p.vec = vec;
  units_of(pr, vec, &p.units_rot, &p.units);
  const int tx = std::min(p.units, kRopeThreads);
  const int max_ty = std::max(1, kRopeThreads / tx);
  const int64_t per_thread = std::max<int64_t>(ceil_div(pr.heads, max_ty), min_hpt);
  const int ty = int(ceil_div(pr.heads, per_thread));
  const int tz = std::min(kRopeMaxBlockZ, std::max(1, kRopeThreads / (tx * ty)));
  p.block_x = tx;
  p.block_y = ty;
  p.block_z = tz;
  p.grid_x = int(std::min<int64_t>(ceil_div(pr.tokens, tz), kRopeMaxGrid));
  p.grid_y = 1;
  return p;
}

// Flat kernel: grid (tokens, head groups), block (units, heads per group), at most kRopeThreads
// threads, the heads split evenly over the groups. False when the grid does not fit.
bool flat_plan(const RopeProblem& pr, int vec, RopePlan* out) {
  RopePlan p;
  p.kind = RopeKernel::kFlat;
  p.vec = vec;
  units_of(pr, vec, &p.units_rot, &p.units);
  const int tx = std::min(p.units, kRopeThreads);
  const int groups = int(ceil_div(pr.heads, std::max(1, kRopeThreads / tx)));
  const int hpg = int(ceil_div(pr.heads, groups));  // <= kRopeThreads / tx
  if (ceil_div(pr.heads, hpg) > kRopeMaxGridY || pr.tokens > kRopeMaxGridX) return false;
  p.block_x = tx;
  p.block_y = hpg;
  p.block_z = 1;
  p.grid_x = int(pr.tokens);
  p.grid_y = int(ceil_div(pr.heads, hpg));
  *out = p;
  return true;
}

int default_hpt(const RopeProblem& pr) { return pr.tokens < kRopeFewTokens ? 1 : kRopePrefillHeadsPerThread; }

// The widest vector the problem allows (the planner's choice, with no allocation on the call path),
// and every width, widest first (candidates, check_plan).
int widest(const RopeProblem& pr) { return pr.vec_ok ? 16 / pr.elem_bytes : 1; }
std::vector<int> widths(const RopeProblem& pr) {
  std::vector<int> w;
  if (pr.vec_ok) w.push_back(16 / pr.elem_bytes);
  w.push_back(1);
  return w;
}

bool same_plan(const RopePlan& a, const RopePlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.units_rot == b.units_rot && a.units == b.units &&
         a.block_x == b.block_x && a.block_y == b.block_y && a.block_z == b.block_z && a.grid_x == b.grid_x &&
         a.grid_y == b.grid_y;
}

}  // namespace

std::string to_string(const RopePlan& plan) {
  std::string s;
  switch (plan.kind) {
    case RopeKernel::kToken:
      s = "rope_token";
      break;
    case RopeKernel::kFlat:
      s = "rope_flat";
      break;
    default:
      s = "rope_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  return s + " vec=" + std::to_string(plan.vec) + " units=" + std::to_string(plan.units_rot) + "+" +
         std::to_string(plan.units - plan.units_rot) + " block=" + std::to_string(plan.block_x) + "x" +
         std::to_string(plan.block_y) + "x" + std::to_string(plan.block_z) + " grid=" + std::to_string(plan.grid_x) +
         "x" + std::to_string(plan.grid_y);
}

// 16-byte vectors of T (16 / sizeof(T) elements) fit when every q/k/output base pointer and the
// cos/sin pointers are 16-byte aligned, every stride (in elements of its tensor) is a multiple of the
// vector, and R/2 (rotate-half) or R (interleaved) is a multiple of the vector.
RopeProblem make_rope_problem(const RopeParams& p, int elem_bytes) {
  RopeProblem pr;
  pr.elem_bytes = elem_bytes;
  pr.tokens = p.batch * p.seq;
  pr.heads = p.t[0].heads + p.t[1].heads;
  pr.head_dim = p.head_dim;
  pr.rot_dim = p.rot_dim;
  pr.interleaved = p.interleaved;
  pr.all_inplace = p.t[0].inplace && (p.t[1].heads == 0 || p.t[1].inplace);
  const int64_t vec = 16 / elem_bytes;
  uintptr_t bits = reinterpret_cast<uintptr_t>(p.cos) | reinterpret_cast<uintptr_t>(p.sin);
  int64_t strides = p.cos_sb | p.cos_ss | p.sin_sb | p.sin_ss;
  for (const RopeHeads& h : p.t) {
    if (h.heads == 0) continue;
    bits |= reinterpret_cast<uintptr_t>(h.in) | reinterpret_cast<uintptr_t>(h.out);
    strides |= h.in_sb | h.in_ss | h.in_sh | h.out_sb | h.out_ss | h.out_sh;
  }
  const bool pairing = (p.interleaved ? p.rot_dim : p.rot_dim / 2) % vec == 0;
  pr.vec_ok = pairing && bits % 16 == 0 && strides % vec == 0;
  return pr;
}

RopePlan plan_rope(const RopeProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  const int vec = widest(pr);
  RopePlan flat;
  if (pr.tokens <= kRopeFlatMaxTokens && flat_plan(pr, vec, &flat)) return flat;
  return token_plan(pr, vec, default_hpt(pr));
}

std::vector<RopePlan> candidate_plans(const RopeProblem& pr, const DeviceInfo& dev) {
  std::vector<RopePlan> plans;
  if (pr.tokens <= 0 || pr.heads <= 0) return plans;
  plans.push_back(plan_rope(pr, dev));
  auto add = [&](const RopePlan& p) {
    for (const RopePlan& q : plans)
      if (same_plan(p, q)) return;
    plans.push_back(p);
  };
  for (int vec : widths(pr)) {
    RopePlan flat;
    if (flat_plan(pr, vec, &flat)) add(flat);
    add(token_plan(pr, vec, 1));
    add(token_plan(pr, vec, kRopePrefillHeadsPerThread));
  }
  return plans;
}

Status check_plan(const RopePlan& plan, const RopeProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  auto fail = [&](const std::string& why) { return Status::Invalid("rope plan " + to_string(plan) + ": " + why); };
  if (plan.kind != RopeKernel::kToken && plan.kind != RopeKernel::kFlat) return fail("unknown kernel");
  if (pr.tokens <= 0 || pr.heads <= 0) return fail("the problem is empty: nothing to launch");
  const std::vector<int> w = widths(pr);
  if (std::find(w.begin(), w.end(), plan.vec) == w.end())
    return fail(plan.vec == 16 / pr.elem_bytes ? "16-byte vectors do not fit this call's pointers, strides or pairing"
                                               : "vec must be 1 or 16 bytes of elements");
  int units_rot = 0, units = 0;
  units_of(pr, plan.vec, &units_rot, &units);
  if (plan.units_rot != units_rot || plan.units != units)
    return fail("a head has " + std::to_string(units_rot) + " rotation and " + std::to_string(units - units_rot) +
                " passthrough units at vec=" + std::to_string(plan.vec));
  if (plan.block_x < 1 || plan.block_y < 1 || plan.block_z < 1 ||
      int64_t(plan.block_x) * plan.block_y * plan.block_z > kRopeThreads)
    return fail("a block holds 1..256 threads");
  if (plan.grid_x < 1 || plan.grid_y < 1) return fail("the grid is empty");
  if (plan.kind == RopeKernel::kToken) {
    if (plan.block_z > kRopeMaxBlockZ) return fail("block_z must be at most 64");
    if (plan.grid_y != 1) return fail("the token kernel's grid is one-dimensional");
  } else {
    if (plan.block_z != 1) return fail("the flat kernel takes one token per block (block_z = 1)");
    if (plan.grid_x != pr.tokens) return fail("the flat kernel's grid_x must be the token count");
    if (plan.grid_y > kRopeMaxGridY) return fail("grid_y must be at most 65535");
    if (int64_t(plan.block_y) * plan.grid_y < pr.heads)
      return fail("the head groups do not cover the " + std::to_string(pr.heads) + " heads");
  }
  return Status::Ok();
}

}  // namespace kernelforge
