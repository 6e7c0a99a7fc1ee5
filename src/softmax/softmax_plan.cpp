// Softmax family planner: Problem -> Plan over the small tables below (notes/softmax.md has the
// measurements; every GB/s figure is bf16 on the H100 SXM unless stated).
//
// The decision, in order:
//   1. 16-byte vectors allowed (vec_ok): the vector plan (3.) at 16 / elem_size elements per access.
//   2. Rows that share a misalignment (head_ok; odd n, contiguous): a scalar head per row, then
//      16-byte vectors: the forward row kernel for rows of 129..2048 vectors (kFwdHeadRows), the
//      register kernel for backward rows one CTA holds, the streaming kernel for rows over 4096
//      elements; else (short rows) the one-element vector plan.
//   3. The vector plan: the team plan (kTeam: threads per row, vectors per thread) decides between one
//      CTA per row group, a register cluster (backward, sm_90) and streaming; the bulk kernel (sm_90)
//      takes forward rows over 32 KB or longer than one CTA holds once there is a wave of rows; a
//      forward one-CTA team plan that softmax_fwd_row was compiled for runs it, the rest softmax_regs.
#include "softmax/softmax_plan.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/align.h"
#include "common/math.h"

namespace kernelforge {

namespace {

// ---- tables ---------------------------------------------------------------------------------------
// The team plan of softmax_regs / softmax_fwd_row: tpr = the power of two giving ~vecs_per_thread
// vectors per thread (<= kSoftmaxMaxTeam threads), iters = the power of two covering the row.
struct TeamTable {
  int vecs_per_thread;  // 2: one vector per thread (2x the threads) lost at 4096 (2747 vs 2864 GB/s
                        // forward), four lost everywhere (2195 / 2346 / 2347 at 2048 / 4096 / 8192)
  int max_iters;        // 8 x 16 B in registers: forward 32 registers of x, backward 64 of (g, y)
  int min_block;        // short rows are packed into blocks of at least this many threads
};
constexpr TeamTable kTeam = {2, 8, 128};

// Row clusters of softmax_regs (backward rows longer than one CTA holds, sm_90): a slice of ~32 KB per
// CTA, 2..8 CTAs of 512 threads. 4096x131072 bf16: 8 CTAs x 512 threads x 4 vectors. The backward's
// streaming form measured 1870 vs 2280 GB/s forward+backward against it.
constexpr int kClusterSliceBytes = 32 * 1024;

// softmax_fwd_row's compiled (threads, vectors per thread): every one-CTA team plan of 128..512
// threads x 1..2 vectors, and 512 x 4 for 16-32 KB rows (2925 / 3006 GB/s at 16384x12288 / 16384x16384
// against softmax_regs' 2214 / 2381; 1024 x 2 measured 2893 / 3005). The kernel exists because the
// generic softmax_regs issued ~530 instructions per warp and row against ~325 for Liger's kernel at
// 16384x8192 (2614 vs 2950 GB/s); compiled for one team size it reaches the copy rate.
struct RowConfig {
  int threads, iters;
};
constexpr RowConfig kFwdRowConfigs[] = {{128, 1}, {256, 1}, {512, 1}, {128, 2}, {256, 2}, {512, 2}, {512, 4}};

// Forward rows with a scalar head (odd n) of 129..2048 vectors: softmax_fwd_row with the head at the
// aligned rows' team size (16384x8191 2854 GB/s against 935 streaming; 16384x4095 2773, 16384x2047
// 2585, 16384x1031 2026, each ahead of Liger). Shorter rows keep the one-element register kernel.
struct HeadRowConfig {
  int64_t max_vecs;  // rows of up to this many 16-byte vectors (from the previous row's + 1)
  int threads, iters;
};
constexpr int64_t kFwdHeadMinVecs = 129;
constexpr HeadRowConfig kFwdHeadRows[] = {
    {256, 128, 2},   // 2 KB..4 KB rows (bf16 1025..2048 elements)
    {512, 256, 2},   // ..8 KB
    {1024, 512, 2},  // ..16 KB
    {2048, 512, 4},  // ..32 KB
};
constexpr RowConfig kFwdHeadConfigs[] = {{128, 2}, {256, 2}, {512, 2}, {512, 4}};  // compiled with the head

// Backward rows with a scalar head: softmax_regs with the head where one CTA per row group holds the
// row (n <= 512 x 8 elements) and every team has a thread per head element (16384x4095 forward +
// backward 2230 -> 2561 GB/s, 1031 1306 -> 2203); longer rows (either direction) stream with the head
// (the streaming kernel on short rows is far slower: 377 / 705 GB/s forward + backward at 1031 / 2047).
constexpr int64_t kHeadStreamMinN = int64_t(kSoftmaxMaxTeam) * 8;

// The bulk-copy kernels (sm_90): C = ceil(row bytes / 64 KB) CTAs per row (<= 8, raised until C | n
// with 16-byte slices), S = 64 KB / (slice bytes x buffers) stages (2..4), pow2(slice vectors / 2)
// threads in [128, 512]. 64 KB slices (one CTA of 2 stages per SM) beat 32 KB: 2750 vs 2091 GB/s at
// 4096x65536, 2682 vs 1923 at 4096x131072. The forward takes rows over 32 KB (8192x24576 1644 -> 2794,
// 8192x32000 1775 -> 2831 against softmax_regs at 8 vectors per thread) and rows longer than one CTA
// holds, once the rows fill a wave (rows >= SMs: a decode-sized grid has nothing to overlap). The
// backward keeps softmax_regs (bulk: forward + backward 2438 vs 2485 GB/s at 4096x131072).
constexpr int kBulkSliceBytes = 64 * 1024;
constexpr int kBulkStageBudget = 64 * 1024;
constexpr int kBulkVecsPerThread = 2;
constexpr int kBulkMinThreads = 128;
constexpr int64_t kBulkMinRowBytesFwd = 32 * 1024 + 1;

// The streaming kernel: CTAs per row on sm_90, 2 from 256 KB rows (forward GB/s at cluster 1 / 2 / 4:
// 4096x65536 2196 / 1764 / 1238, 4096x131072 1913 / 2077 / 1615, 2048x262144 1835 / 1873 / 1914), fewer
// where a CTA's slice would hold under 1024 vectors.
constexpr int64_t kStreamClusterRowBytes = 256 * 1024;

// ---- helpers --------------------------------------------------------------------------------------
int vec16_of(const SoftmaxProblem& pr) { return 16 / pr.elem_size; }
int64_t row_bytes(const SoftmaxProblem& pr) { return pr.n * int64_t(pr.elem_size); }
bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The team plan at `vec` elements per access: a one-CTA team (cluster 1), a register cluster
// (backward, sm_90), or none (kind kStream: the row is longer than both hold).
struct TeamPlan {
  bool stream = false;
  int tpr = 0, iters = 1, cluster = 1;
};
TeamPlan team_plan(const SoftmaxProblem& pr, const DeviceInfo& dev, int vec) {
  const int64_t nvec = ceil_div(pr.n, vec);
  TeamPlan pl;
  const int tpr = int(std::min<int64_t>(kSoftmaxMaxTeam, pow2_ceil(ceil_div(nvec, kTeam.vecs_per_thread))));
  const int iters = pow2_ceil(ceil_div(nvec, tpr));
  if (iters <= kTeam.max_iters) {
    pl.tpr = tpr;
    pl.iters = iters;
    // Problems under one wave of blocks (decode) take one vector per thread where 512 threads cover
    // the row: the latency is one load and one reduction (1x4096 replayed in a graph: 1.47 us).
    const int block = std::max(tpr, kTeam.min_block);
    const int64_t units = ceil_div(pr.rows, block / tpr);
    if (iters > 1 && nvec <= kSoftmaxMaxTeam && units < dev.sm_count) {
      pl.tpr = pow2_ceil(nvec);
      pl.iters = 1;
    }
    return pl;
  }
  // Forward rows longer than one CTA holds stream (or take the bulk kernel); the backward takes a
  // register cluster on sm_90.
  pl.stream = true;
  if (!pr.backward || dev.capability < 90) return pl;
  const int c0 =
      int(std::min<int64_t>(kSoftmaxMaxCluster, std::max<int64_t>(2, ceil_div(row_bytes(pr), kClusterSliceBytes))));
  const int it = pow2_ceil(ceil_div(nvec, int64_t(c0) * kSoftmaxMaxTeam));
  if (it > kTeam.max_iters) return pl;
  pl.stream = false;
  pl.tpr = kSoftmaxMaxTeam;
  pl.iters = it;
  pl.cluster = int(ceil_div(nvec, int64_t(kSoftmaxMaxTeam) * it));
  return pl;
}

SoftmaxPlan regs_plan(const SoftmaxProblem& pr, const TeamPlan& tp, int vec, bool head) {
  SoftmaxPlan pl;
  pl.kind = SoftmaxKernel::kRegs;
  pl.vec = vec;
  pl.iters = tp.iters;
  pl.threads = tp.tpr;
  pl.cluster = tp.cluster;
  pl.rows_per_block = tp.cluster > 1 ? 1 : std::max(tp.tpr, kTeam.min_block) / tp.tpr;
  // Forward at one CTA per row group, exponentials in <= 16 float registers per thread: a max then a
  // sum reduction (16384x2048 / 4096 2605 / 2694 GB/s against 2375 / 2498 for one (m, s) reduction);
  // softmax at 512-thread teams keeps x packed and recomputes exp (16384x8192: 2619 vs 2542).
  pl.mode = SoftmaxRegsMode::kOnline;
  if (!pr.backward && tp.iters * vec <= 16 && tp.cluster == 1)
    pl.mode =
        (!pr.log && tp.tpr >= kSoftmaxMaxTeam) ? SoftmaxRegsMode::kMaxThenSumRepeat : SoftmaxRegsMode::kMaxThenSum;
  pl.scalar_head = head && pr.backward && vec > 1;
  return pl;
}

SoftmaxPlan stream_plan(const SoftmaxProblem& pr, const DeviceInfo& dev, int vec, bool head, int cluster) {
  SoftmaxPlan pl;
  pl.kind = SoftmaxKernel::kStream;
  pl.vec = vec;
  pl.iters = 0;
  pl.threads = kSoftmaxStreamThreads;
  pl.cluster = dev.capability >= 90 ? std::min(kSoftmaxMaxCluster, std::max(1, cluster)) : 1;
  // no more CTAs per row than a slice of 1024 vectors per CTA can use (short rows: one CTA)
  while (pl.cluster > 1 && pr.n < int64_t(pl.cluster) * kSoftmaxStreamThreads * vec) pl.cluster >>= 1;
  pl.scalar_head = head && vec > 1;
  return pl;
}
SoftmaxPlan stream_plan(const SoftmaxProblem& pr, const DeviceInfo& dev, int vec, bool head) {
  return stream_plan(pr, dev, vec, head, row_bytes(pr) >= kStreamClusterRowBytes ? 2 : 1);
}

// The bulk plan at `cluster` CTAs per row and `stages` stages (0: the table's count); kind kStream
// (not a bulk plan) when the shape does not fit: slices not whole 16-byte vectors, over the shared
// memory cap, or over 8 vectors per thread.
bool bulk_plan_at(const SoftmaxProblem& pr, int cluster, int stages, int threads, SoftmaxPlan* out) {
  const int vec = vec16_of(pr);
  const int buffers = pr.backward ? 2 : 1;
  if (cluster < 1 || cluster > kSoftmaxMaxCluster || pr.n < 1) return false;
  if (pr.n % cluster != 0 || ((pr.n / cluster) * pr.elem_size) % 16 != 0) return false;
  const int64_t slice_bytes = row_bytes(pr) / cluster;
  if (stages == 0)
    stages =
        int(std::min<int64_t>(kSoftmaxBulkMaxStages, std::max<int64_t>(2, kBulkStageBudget / (slice_bytes * buffers))));
  if (int64_t(stages) * buffers * slice_bytes > kSoftmaxBulkMaxSmem) return false;
  const int64_t svec = (pr.n / cluster) / vec;
  if (threads == 0)
    threads =
        std::min(kSoftmaxBulkMaxThreads, std::max(kBulkMinThreads, pow2_ceil(ceil_div(svec, kBulkVecsPerThread))));
  SoftmaxPlan pl;
  pl.kind = pr.backward ? SoftmaxKernel::kBulkBwd : SoftmaxKernel::kBulkFwd;
  pl.vec = vec;
  pl.threads = threads;
  pl.cluster = cluster;
  pl.stages = stages;
  pl.iters = 0;
  if (!pr.backward) {
    pl.iters = pow2_ceil(ceil_div(svec, threads));
    if (pl.iters > 8) return false;
  }
  *out = pl;
  return true;
}
bool bulk_plan(const SoftmaxProblem& pr, const DeviceInfo& dev, SoftmaxPlan* out) {
  if (dev.capability < 90 || !pr.vec_ok || pr.n < 1) return false;
  int cluster = int(std::min<int64_t>(kSoftmaxMaxCluster, ceil_div(row_bytes(pr), kBulkSliceBytes)));
  while (cluster <= kSoftmaxMaxCluster && (pr.n % cluster != 0 || ((pr.n / cluster) * pr.elem_size) % 16 != 0))
    ++cluster;
  return bulk_plan_at(pr, cluster, 0, 0, out);
}

// The vector plan at `vec` elements per access (head: rows with a scalar head, never bulk).
SoftmaxPlan vector_plan(const SoftmaxProblem& pr, const DeviceInfo& dev, int vec, bool head, bool allow_bulk) {
  const TeamPlan tp = team_plan(pr, dev, vec);
  const bool long_row = tp.stream || tp.cluster > 1;
  const int64_t min_bulk_row = pr.backward ? int64_t(INT_MAX) : kBulkMinRowBytesFwd;
  const bool bulk = allow_bulk && !head && vec == vec16_of(pr) && pr.rows >= dev.sm_count &&
                    ((long_row && !pr.backward) || row_bytes(pr) >= min_bulk_row);
  SoftmaxPlan pl;
  if (bulk && bulk_plan(pr, dev, &pl)) return pl;
  if (tp.stream) return stream_plan(pr, dev, vec, head);
  if (!pr.backward && vec * pr.elem_size == 16 && tp.cluster == 1 && pr.n % vec == 0) {
    for (const RowConfig& rc : kFwdRowConfigs) {
      if (rc.threads == tp.tpr && rc.iters == tp.iters) {
        pl = SoftmaxPlan{};
        pl.kind = SoftmaxKernel::kFwdRow;
        pl.vec = vec;
        pl.iters = rc.iters;
        pl.threads = rc.threads;
        return pl;
      }
    }
  }
  return regs_plan(pr, tp, vec, head);
}

SoftmaxPlan plan_impl(const SoftmaxProblem& pr, const DeviceInfo& dev, bool allow_bulk) {
  const int vec = vec16_of(pr);
  if (pr.vec_ok) return vector_plan(pr, dev, vec, false, allow_bulk);
  if (pr.head_ok) {
    const int64_t nvec = ceil_div(pr.n, vec);
    if (!pr.backward && nvec >= kFwdHeadMinVecs) {
      for (const HeadRowConfig& hc : kFwdHeadRows) {
        if (nvec <= hc.max_vecs) {
          SoftmaxPlan pl;
          pl.kind = SoftmaxKernel::kFwdRow;
          pl.vec = vec;
          pl.iters = hc.iters;
          pl.threads = hc.threads;
          pl.scalar_head = true;
          return pl;
        }
      }
    }
    if (pr.backward && pr.n <= kHeadStreamMinN) {
      const TeamPlan tp = team_plan(pr, dev, vec);
      if (!tp.stream && tp.tpr >= vec && tp.cluster == 1) return regs_plan(pr, tp, vec, true);
    }
    if (pr.n > kHeadStreamMinN) return stream_plan(pr, dev, vec, true);
  }
  return vector_plan(pr, dev, 1, false, allow_bulk);
}

void add_unique(std::vector<SoftmaxPlan>* v, const SoftmaxPlan& p) {
  for (const SoftmaxPlan& q : *v)
    if (q == p) return;
  v->push_back(p);
}

Status bad(const SoftmaxPlan& plan, const std::string& why) {
  return Status::Invalid("softmax plan " + to_string(plan) + ": " + why);
}

}  // namespace

const char* kernel_name(SoftmaxKernel k) {
  switch (k) {
    case SoftmaxKernel::kRegs:
      return "regs";
    case SoftmaxKernel::kFwdRow:
      return "fwd_row";
    case SoftmaxKernel::kStream:
      return "stream";
    case SoftmaxKernel::kBulkFwd:
      return "bulk_fwd";
    case SoftmaxKernel::kBulkBwd:
      return "bulk_bwd";
  }
  return "unknown";
}

std::string to_string(const SoftmaxPlan& p) {
  std::string s = std::string(kernel_name(p.kind)) + " vec=" + std::to_string(p.vec);
  if (p.iters > 0) s += " iters=" + std::to_string(p.iters);
  s += " threads=" + std::to_string(p.threads);
  if (p.rows_per_block != 1) s += " rows_per_block=" + std::to_string(p.rows_per_block);
  if (p.cluster != 1) s += " cluster=" + std::to_string(p.cluster);
  if (p.stages != 0) s += " stages=" + std::to_string(p.stages);
  if (p.kind == SoftmaxKernel::kRegs)
    s += p.mode == SoftmaxRegsMode::kOnline       ? " mode=online"
         : p.mode == SoftmaxRegsMode::kMaxThenSum ? " mode=max_then_sum"
                                                  : " mode=max_then_sum_repeat";
  if (p.scalar_head) s += " scalar_head";
  return s;
}

bool operator==(const SoftmaxPlan& a, const SoftmaxPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.iters == b.iters && a.threads == b.threads &&
         a.rows_per_block == b.rows_per_block && a.cluster == b.cluster && a.stages == b.stages && a.mode == b.mode &&
         a.scalar_head == b.scalar_head;
}

SoftmaxProblem make_softmax_problem(const SoftmaxParams& p, bool log, bool backward, int elem_size) {
  SoftmaxProblem pr;
  pr.log = log;
  pr.backward = backward;
  pr.elem_size = elem_size;
  pr.rows = p.rows;
  pr.n = p.n;
  const uintptr_t in = reinterpret_cast<uintptr_t>(p.in), y = reinterpret_cast<uintptr_t>(p.y),
                  out = reinterpret_cast<uintptr_t>(p.out);
  uintptr_t bits = in | y | out;
  if (p.rows > 1) bits |= static_cast<uintptr_t>(p.in_stride | p.y_stride | p.out_stride) * uintptr_t(elem_size);
  pr.vec_ok = bits % 16 == 0;
  pr.head_ok = in % uintptr_t(elem_size) == 0 &&
               shares_misalignment(p.in, p.out, (p.in_stride - p.out_stride) * int64_t(elem_size)) &&
               (p.y == nullptr || shares_misalignment(p.in, p.y, (p.in_stride - p.y_stride) * int64_t(elem_size)));
  return pr;
}

SoftmaxPlan plan_softmax(const SoftmaxProblem& pr, const DeviceInfo& dev) { return plan_impl(pr, dev, true); }

SoftmaxPlan fallback_plan(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const DeviceInfo& dev) {
  switch (plan.kind) {
    case SoftmaxKernel::kBulkFwd:
    case SoftmaxKernel::kBulkBwd:
      return plan_impl(pr, dev, false);
    case SoftmaxKernel::kRegs:
      return stream_plan(pr, dev, plan.vec, plan.scalar_head);
    default:
      return stream_plan(pr, dev, plan.vec, plan.scalar_head, 1);
  }
}

int64_t plan_smem_bytes(const SoftmaxPlan& plan, const SoftmaxProblem& pr) {
  if (plan.kind != SoftmaxKernel::kBulkFwd && plan.kind != SoftmaxKernel::kBulkBwd) return 0;
  const int buffers = plan.kind == SoftmaxKernel::kBulkBwd ? 2 : 1;
  return int64_t(plan.stages) * buffers * (row_bytes(pr) / std::max(1, plan.cluster));
}

std::vector<SoftmaxPlan> candidate_plans(const SoftmaxProblem& pr, const DeviceInfo& dev) {
  std::vector<SoftmaxPlan> v;
  v.push_back(plan_softmax(pr, dev));
  const int vec16 = vec16_of(pr);
  const bool sm90 = dev.capability >= 90;
  // (vector width, scalar head) pairs the alignment allows
  struct Width {
    int vec;
    bool head;
  };
  std::vector<Width> widths;
  if (pr.vec_ok) widths.push_back({vec16, false});
  if (!pr.vec_ok && pr.head_ok && vec16 > 1) widths.push_back({vec16, true});
  widths.push_back({1, false});
  const int iters_list[] = {1, 2, 4, 8};
  for (const Width& w : widths) {
    const int64_t nvec = ceil_div(pr.n, w.vec);
    // softmax_regs at one CTA per row group: the smallest team covering the row at each vector count
    if (!w.head || pr.backward) {
      for (int it : iters_list) {
        const int64_t tpr = pow2_ceil(ceil_div(nvec, it));
        if (tpr > kSoftmaxMaxTeam) continue;
        TeamPlan tp;
        tp.tpr = int(tpr);
        tp.iters = it;
        SoftmaxPlan base = regs_plan(pr, tp, w.vec, w.head);
        if (w.head && base.threads < w.vec) continue;  // a thread per head element
        add_unique(&v, base);
        if (!pr.backward && it * w.vec <= 16) {  // the other forward modes compiled for this shape
          for (SoftmaxRegsMode m :
               {SoftmaxRegsMode::kOnline, SoftmaxRegsMode::kMaxThenSum, SoftmaxRegsMode::kMaxThenSumRepeat}) {
            if (pr.log && m == SoftmaxRegsMode::kMaxThenSumRepeat) continue;
            SoftmaxPlan p = base;
            p.mode = m;
            add_unique(&v, p);
          }
        }
      }
      // softmax_regs over a cluster of 512-thread CTAs (sm_90, no head): every cluster size that the
      // vector counts give
      if (sm90 && !w.head) {
        for (int it : iters_list) {
          const int64_t c = ceil_div(nvec, int64_t(kSoftmaxMaxTeam) * it);
          if (c < 2 || c > kSoftmaxMaxCluster) continue;
          TeamPlan tp;
          tp.tpr = kSoftmaxMaxTeam;
          tp.iters = it;
          tp.cluster = int(c);
          add_unique(&v, regs_plan(pr, tp, w.vec, false));
        }
      }
    }
    // softmax_fwd_row at every compiled configuration covering the row
    if (!pr.backward && w.vec * pr.elem_size == 16 && (w.head || pr.n % w.vec == 0)) {
      auto add_row = [&](int threads, int iters) {
        if (int64_t(threads) * iters < nvec) return;
        SoftmaxPlan p;
        p.kind = SoftmaxKernel::kFwdRow;
        p.vec = w.vec;
        p.threads = threads;
        p.iters = iters;
        p.scalar_head = w.head;
        add_unique(&v, p);
      };
      if (w.head) {
        for (const RowConfig& rc : kFwdHeadConfigs) add_row(rc.threads, rc.iters);
      } else {
        for (const RowConfig& rc : kFwdRowConfigs) add_row(rc.threads, rc.iters);
      }
    }
    // softmax_stream at 1, 2, 4 and 8 CTAs per row (sm_90; each CTA's slice at least 1024 vectors)
    for (int c = 1; c <= (sm90 ? kSoftmaxMaxCluster : 1); c *= 2) {
      const SoftmaxPlan p = stream_plan(pr, dev, w.vec, w.head, c);
      if (p.cluster == c) add_unique(&v, p);
    }
  }
  // the bulk kernels (sm_90, 16-byte vectors) at every cluster size that splits the row into 16-byte
  // slices and every stage count that fits the shared memory cap, any row length and count
  if (sm90 && pr.vec_ok) {
    for (int c = 1; c <= kSoftmaxMaxCluster; ++c)
      for (int s = 2; s <= kSoftmaxBulkMaxStages; ++s) {
        SoftmaxPlan p;
        if (bulk_plan_at(pr, c, s, 0, &p)) add_unique(&v, p);
      }
  }
  return v;
}

Status check_plan(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const DeviceInfo& dev) {
  const int vec16 = vec16_of(pr);
  const int64_t n = pr.n;
  if (pr.elem_size != 2 && pr.elem_size != 4) return bad(plan, "element size must be 2 or 4 bytes");
  if (plan.vec != 1 && plan.vec != vec16)
    return bad(plan, "vec must be 1 or " + std::to_string(vec16) + " (16 bytes) elements");
  if (plan.vec == vec16 && vec16 > 1 && !pr.vec_ok && !(plan.scalar_head && pr.head_ok))
    return bad(plan,
               "16-byte vectors need 16-byte aligned pointers and row strides (or rows sharing a misalignment, "
               "with scalar_head)");
  if (plan.scalar_head && (!pr.head_ok || plan.vec != vec16 || vec16 == 1))
    return bad(plan, "scalar_head needs 16-byte vectors and rows that share their misalignment");
  if (plan.cluster < 1 || plan.cluster > kSoftmaxMaxCluster) return bad(plan, "cluster must be 1..8");
  if (plan.cluster > 1 && dev.capability < 90) return bad(plan, "clusters need sm_90");
  if (plan.rows_per_block != 1 && plan.kind != SoftmaxKernel::kRegs)
    return bad(plan, "rows_per_block must be 1 for this kernel");
  if (plan.mode != SoftmaxRegsMode::kOnline && plan.kind != SoftmaxKernel::kRegs)
    return bad(plan, "mode applies to softmax_regs only");
  const int64_t nvec = ceil_div(n, plan.vec);
  switch (plan.kind) {
    case SoftmaxKernel::kRegs: {
      if (!is_pow2(plan.threads) || plan.threads > kSoftmaxMaxTeam)
        return bad(plan, "threads must be a power of two <= 512");
      if (plan.iters != 1 && plan.iters != 2 && plan.iters != 4 && plan.iters != 8)
        return bad(plan, "iters must be 1, 2, 4 or 8");
      const int block = plan.threads * plan.rows_per_block;
      if (plan.rows_per_block < 1 || block > kSoftmaxMaxTeam || block % 32 != 0)
        return bad(plan, "threads x rows_per_block must be a multiple of 32 up to 512");
      if (plan.cluster > 1 && plan.rows_per_block != 1) return bad(plan, "a cluster holds one row");
      if (int64_t(plan.threads) * plan.iters * plan.cluster < nvec)
        return bad(plan, "threads x iters x cluster covers fewer than the row's " + std::to_string(nvec) + " vectors");
      if (plan.stages != 0) return bad(plan, "stages applies to the bulk kernels only");
      if (plan.mode != SoftmaxRegsMode::kOnline) {
        if (pr.backward) return bad(plan, "the backward runs mode online only");
        if (plan.cluster > 1) return bad(plan, "a cluster runs mode online only");
        if (plan.iters * plan.vec > 16) return bad(plan, "the two-reduction modes hold at most 16 values per thread");
        if (pr.log && plan.mode == SoftmaxRegsMode::kMaxThenSumRepeat)
          return bad(plan, "max_then_sum_repeat is softmax's (log_softmax: max_then_sum)");
      }
      if (plan.scalar_head) {
        if (!pr.backward) return bad(plan, "softmax_regs takes a scalar head in the backward only");
        if (plan.cluster > 1) return bad(plan, "a scalar head needs one CTA per row");
        if (plan.threads < plan.vec) return bad(plan, "a scalar head needs a thread per head element");
      }
      return Status::Ok();
    }
    case SoftmaxKernel::kFwdRow: {
      if (pr.backward) return bad(plan, "softmax_fwd_row is forward only");
      if (plan.vec != vec16 || vec16 == 1) return bad(plan, "softmax_fwd_row needs 16-byte vectors");
      bool compiled = false;
      if (plan.scalar_head) {
        for (const RowConfig& rc : kFwdHeadConfigs) compiled |= rc.threads == plan.threads && rc.iters == plan.iters;
      } else {
        for (const RowConfig& rc : kFwdRowConfigs) compiled |= rc.threads == plan.threads && rc.iters == plan.iters;
      }
      if (!compiled) return bad(plan, "softmax_fwd_row is not compiled for these threads and iters");
      if (plan.cluster != 1 || plan.stages != 0) return bad(plan, "softmax_fwd_row runs one CTA per row, no stages");
      if (!plan.scalar_head && n % plan.vec != 0) return bad(plan, "softmax_fwd_row needs n a multiple of vec");
      if (int64_t(plan.threads) * plan.iters < nvec)
        return bad(plan, "threads x iters covers fewer than the row's " + std::to_string(nvec) + " vectors");
      return Status::Ok();
    }
    case SoftmaxKernel::kStream:
      if (plan.threads != kSoftmaxStreamThreads || plan.iters != 0 || plan.stages != 0)
        return bad(plan, "softmax_stream runs 1024 threads, iters 0, no stages");
      return Status::Ok();
    case SoftmaxKernel::kBulkFwd:
    case SoftmaxKernel::kBulkBwd: {
      if ((plan.kind == SoftmaxKernel::kBulkBwd) != pr.backward)
        return bad(plan,
                   pr.backward ? "the backward's bulk kernel is bulk_bwd" : "the forward's bulk kernel is bulk_fwd");
      if (dev.capability < 90) return bad(plan, "the bulk kernels need sm_90");
      if (!pr.vec_ok || plan.vec != vec16 || plan.scalar_head)
        return bad(plan, "the bulk kernels copy whole 16-byte aligned rows");
      if (n % plan.cluster != 0 || ((n / plan.cluster) * pr.elem_size) % 16 != 0)
        return bad(plan, "the cluster must split the row into slices of whole 16-byte vectors");
      if (plan.stages < 2 || plan.stages > kSoftmaxBulkMaxStages) return bad(plan, "stages must be 2..4");
      if (plan_smem_bytes(plan, pr) > kSoftmaxBulkMaxSmem)
        return bad(plan, "stages x slices need " + std::to_string(plan_smem_bytes(plan, pr)) +
                             " bytes of shared memory, over the 200 KB cap");
      if (plan.threads != 128 && plan.threads != 256 && plan.threads != 512)
        return bad(plan, "threads must be 128, 256 or 512");
      if (plan.kind == SoftmaxKernel::kBulkBwd) {
        if (plan.iters != 0) return bad(plan, "bulk_bwd loops over its slice: iters 0");
      } else {
        if (plan.iters != 1 && plan.iters != 2 && plan.iters != 4 && plan.iters != 8)
          return bad(plan, "iters must be 1, 2, 4 or 8");
        if (int64_t(plan.threads) * plan.iters < (n / plan.cluster) / plan.vec)
          return bad(plan, "threads x iters covers fewer than the slice's vectors");
      }
      return Status::Ok();
    }
  }
  return bad(plan, "unknown kernel");
}

}  // namespace kernelforge
