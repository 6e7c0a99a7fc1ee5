// Shared by the float64 references (reference.cpp, reference_bwd.cpp): the sequences of a call,
// with varlen's cu_seqlens read on the host and checked (the CUDA kernels cannot check them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_problem.h"

namespace kernelforge {
namespace ref {
namespace detail {

// One sequence of the batch: its first query / key row and its lengths.
struct Seq {
  int64_t q0 = 0, sq = 0, k0 = 0, sk = 0;
};

// Reads cu_seqlens (host memory) and checks what the kernels assume: starts at 0, non-decreasing,
// ends at the token count, and no sequence longer than the max_seqlen bound when one is given.
inline Status read_cu(const char* entry, const TensorView& cu, const char* name, int64_t total, int64_t max_len,
                      const char* max_name, std::vector<int64_t>* start, std::vector<int64_t>* len) {
  const int32_t* x = static_cast<const int32_t*>(cu.data);
  const int64_t B = cu.shape[0] - 1;
  auto fail = [&](const std::string& m) { return Status::Invalid(std::string(entry) + ": " + name + " " + m); };
  if (x[0] != 0) return fail("must start at 0, got " + std::to_string(x[0]));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = int64_t(x[b + 1]) - x[b];
    if (n < 0)
      return fail("must be non-decreasing, got " + std::to_string(x[b]) + " then " + std::to_string(x[b + 1]) +
                  " at index " + std::to_string(b));
    if (max_len > 0 && n > max_len)
      return fail("holds a sequence of " + std::to_string(n) + " tokens (index " + std::to_string(b) + "), more than " +
                  max_name + " = " + std::to_string(max_len));
    (*start)[b] = x[b];
    (*len)[b] = n;
  }
  if (x[B] != total)
    return fail("must end at the token count " + std::to_string(total) + ", got " + std::to_string(x[B]));
  return Status::Ok();
}

// The sequences of a validated call (p from validate_attention): one per batch entry.
inline Status read_seqs(const char* entry, const AttentionTensors& t, const AttentionOptions& o,
                        const AttentionParams& p, std::vector<Seq>* seqs) {
  const int64_t B = p.batch;
  seqs->assign(static_cast<size_t>(B), Seq{});
  if (!p.varlen) {
    for (int64_t b = 0; b < B; ++b) (*seqs)[b] = Seq{0, p.seqlen_q, 0, p.seqlen_k};
    return Status::Ok();
  }
  std::vector<int64_t> q0(B), sq(B), k0(B), sk(B);
  Status s = read_cu(entry, *t.cu_seqlens_q, "cu_seqlens_q", t.q->shape[0], o.max_seqlen_q, "max_seqlen_q", &q0, &sq);
  if (!s.ok()) return s;
  s = read_cu(entry, *t.cu_seqlens_k, "cu_seqlens_k", t.k->shape[0], o.max_seqlen_k, "max_seqlen_k", &k0, &sk);
  if (!s.ok()) return s;
  for (int64_t b = 0; b < B; ++b) (*seqs)[b] = Seq{q0[b], sq[b], k0[b], sk[b]};
  return Status::Ok();
}

}  // namespace detail
}  // namespace ref
}  // namespace kernelforge
