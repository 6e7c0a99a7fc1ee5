// Graph builders shared by the graph family's tests: random CSR segments with power-law degrees,
// empty segments and one long segment, and edge lists sorted into CSR on the host (stable sorts,
// the same construction the PyTorch binding does with torch.sort).
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernelforge/graph.h"
#include "test_util.h"

namespace kftest {

// Destination of each of `nnz` items over n segments: skewed towards low indices (u^2), so high
// segments are often empty; the first `long_seg` items go to segment n / 2.
inline std::vector<int64_t> skewed_targets(int64_t n, int64_t nnz, int64_t long_seg, Rng& rng) {
  std::vector<int64_t> t(static_cast<size_t>(nnz));
  for (int64_t i = 0; i < nnz; ++i) {
    const double u = rng.uniform(0.0, 1.0);
    t[i] = i < long_seg ? n / 2 : std::min<int64_t>(n - 1, static_cast<int64_t>(double(n) * u * u));
  }
  return t;
}

// rowptr [n + 1] of items grouped by target (counts, then a prefix sum).
inline std::vector<int64_t> rowptr_of(const std::vector<int64_t>& targets, int64_t n) {
  std::vector<int64_t> rp(static_cast<size_t>(n + 1), 0);
  for (int64_t t : targets) ++rp[t + 1];
  for (int64_t v = 0; v < n; ++v) rp[v + 1] += rp[v];
  return rp;
}

// The stable order of items by key.
inline std::vector<int64_t> stable_order(const std::vector<int64_t>& key) {
  std::vector<int64_t> perm(key.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  return perm;
}

inline HostTensor index_tensor(DType t, const std::vector<int64_t>& v) {
  HostTensor h(t, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) h.set(static_cast<int64_t>(i), static_cast<double>(v[i]));
  return h;
}

// An edge list (src in [0, X), dst in [0, N)) and its two CSR forms.
struct EdgeGraph {
  std::vector<int64_t> src, dst;
  // by destination: rowptr [N + 1], col = src of each sorted edge, eid = its original index
  std::vector<int64_t> rowptr, col, eid;
  // by source (the backward's transposed CSR): rowptr_t [X + 1], col_t = dst, eid_t
  std::vector<int64_t> rowptr_t, col_t, eid_t;
};

inline EdgeGraph make_edges(int64_t n, int64_t x_rows, int64_t edges, int64_t long_seg, Rng& rng) {
  EdgeGraph g;
  g.dst = skewed_targets(n, edges, long_seg, rng);
  g.src.resize(static_cast<size_t>(edges));
  for (auto& s : g.src) s = std::min<int64_t>(x_rows - 1, static_cast<int64_t>(rng.uniform(0.0, double(x_rows))));
  g.rowptr = rowptr_of(g.dst, n);
  g.eid = stable_order(g.dst);
  for (int64_t e : g.eid) g.col.push_back(g.src[e]);
  g.rowptr_t = rowptr_of(g.src, x_rows);
  g.eid_t = stable_order(g.src);
  for (int64_t e : g.eid_t) g.col_t.push_back(g.dst[e]);
  return g;
}

// Edge weights of random sign and magnitude 0.5, 1 or 2: products with x are exact in every dtype,
// so the position of a maximum does not depend on the precision of the product.
inline HostTensor pow2_weights(DType t, int64_t n, Rng& rng) {
  HostTensor h(t, {n});
  for (int64_t i = 0; i < n; ++i) {
    const double m = std::ldexp(1.0, static_cast<int>(rng.uniform(0.0, 3.0)) - 1);
    h.set(i, rng.uniform(0.0, 1.0) < 0.5 ? -m : m);
  }
  return h;
}

}  // namespace kftest
