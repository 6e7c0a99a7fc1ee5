// Public entry points of the GEMM family: validate (gemm_validate.cpp), check the device, plan (cuBLASLt's
// heuristic, cached per distinct problem), run (cublasLtMatmul with the fused epilogue; the family's own
// kernels for K = 0 and for row sums without a product).
//
// cuBLASLt is column-major. out [M, N] row-major is the column-major N x M matrix D, so D = op(A) op(B)
// with A <- b (m = N rows of D) and B <- a (n = M columns): a row-major b [N, K] is the column-major
// K x N matrix taken transposed, a column-major one is N x K taken as is; a row-major a [M, K] is the
// column-major K x M matrix taken as is, a column-major one M x K taken transposed. The bias (length m =
// N) is cuBLASLt's per-row bias of D; a_sum, the sum of op(B) over k (length n = M), its BGRADB epilogue.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/device.h"
#include "common/dispatch.h"
#include "gemm/gemm_problem.h"

namespace kernelforge {

template <typename T>
Status launch_gemm_fill(const GemmParams& p, GemmActivation act, const DeviceInfo& dev, cudaStream_t stream);
template <typename T>
Status launch_gemm_row_sum(const GemmParams& p, const DeviceInfo& dev, cudaStream_t stream);

std::string to_string(const GemmPlan& plan) {
  if (plan.algo_id < 0) return "gemm_none (no product: K = 0 or an empty output)";
  return "gemm_cublaslt algo=" + std::to_string(plan.algo_id) + " tile=" + std::to_string(plan.tile) +
         " stages=" + std::to_string(plan.stages) + " split_k=" + std::to_string(plan.split_k) +
         " ws=" + std::to_string(plan.workspace) + (plan.tuned ? " tuned" : " untuned");
}

namespace {

struct Prepared {
  GemmParams p;
  DType dtype = DType::kFloat16;
  int device = 0;
  const DeviceInfo* dev = nullptr;
};

Status prepare(const GemmTensors& t, GemmActivation act, Prepared* w) {
  Status s = validate_gemm("gemm", true, t, act, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device("gemm", t.a->device.index, w->dtype, &w->dev)).ok()) return s;
  w->device = t.a->device.index;
  return Status::Ok();
}

bool product(const GemmParams& p) { return p.batch > 0 && p.M > 0 && p.N > 0 && p.K > 0; }

Status lt_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Cuda(std::string("gemm: cuBLASLt ") + what + " failed: " + cublasLtGetStatusString(st));
}

// One cuBLASLt handle per device, created on first use and kept for the process (the handle holds no
// stream; cuBLASLt calls on one handle may come from several threads).
Status handle_for(int device, cublasLtHandle_t* out) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it == handles.end()) {
    cublasLtHandle_t h = nullptr;
    Status s = lt_status(cublasLtCreate(&h), "cublasLtCreate");
    if (!s.ok()) return s;
    it = handles.emplace(device, h).first;
  }
  *out = it->second;
  return Status::Ok();
}

cublasLtEpilogue_t epilogue_of(const GemmParams& p, GemmActivation act) {
  const bool bias = p.bias != nullptr;
  if (p.a_sum != nullptr) return CUBLASLT_EPILOGUE_BGRADB;
  switch (act) {
    case GemmActivation::kRelu:
      return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case GemmActivation::kGeluTanh:
      if (p.aux != nullptr) return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case GemmActivation::kNone:
      break;
  }
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

uint32_t alignment(const void* ptr) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(ptr);
  return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : v % 4 == 0 ? 4 : 2;
}

// The descriptors of one call; the pointers of the epilogue are set too, so the same object runs it.
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (lc != nullptr) cublasLtMatrixLayoutDestroy(lc);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

template <typename V>
Status set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& value, const char* what) {
  return lt_status(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)), what);
}

Status make_desc(const GemmParams& p, DType dtype, GemmActivation act, Desc* d) {
  const cudaDataType_t type =
      dtype == DType::kBFloat16 ? CUDA_R_16BF : (dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_32F);
  Status s = lt_status(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  if (!s.ok()) return s;
  // A <- b: N x K taken as is when column-major, K x N transposed when row-major.
  const cublasOperation_t ta = p.b.row_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.a.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_TRANSA, ta, "TRANSA")).ok()) return s;
  if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_TRANSB, tb, "TRANSB")).ok()) return s;
  const cublasLtEpilogue_t epi = epilogue_of(p, act);
  if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi, "EPILOGUE")).ok()) return s;
  const void* bias = p.a_sum != nullptr ? p.a_sum : p.bias;
  if (bias != nullptr) {
    if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "BIAS_POINTER")).ok()) return s;
    if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type, "BIAS_DATA_TYPE")).ok()) return s;
  }
  if (p.aux != nullptr) {
    const int64_t ld = p.N;
    if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux, "AUX_POINTER")).ok()) return s;
    if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld, "AUX_LD")).ok()) return s;
    if (!(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, type, "AUX_DATA_TYPE")).ok()) return s;
    if (p.batch > 1 &&
        !(s = set_desc(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, int64_t(p.M * p.N), "AUX_BATCH_STRIDE"))
             .ok())
      return s;
  }
  const uint64_t M = uint64_t(p.M), N = uint64_t(p.N), K = uint64_t(p.K);
  s = lt_status(p.b.row_major ? cublasLtMatrixLayoutCreate(&d->la, type, K, N, p.b.ld)
                              : cublasLtMatrixLayoutCreate(&d->la, type, N, K, p.b.ld),
                "cublasLtMatrixLayoutCreate(b)");
  if (!s.ok()) return s;
  s = lt_status(p.a.row_major ? cublasLtMatrixLayoutCreate(&d->lb, type, K, M, p.a.ld)
                              : cublasLtMatrixLayoutCreate(&d->lb, type, M, K, p.a.ld),
                "cublasLtMatrixLayoutCreate(a)");
  if (!s.ok()) return s;
  if (!(s = lt_status(cublasLtMatrixLayoutCreate(&d->lc, type, N, M, p.ldo), "cublasLtMatrixLayoutCreate(out)")).ok())
    return s;
  // Batched: one strided batch per layout (stride 0: the matrix is shared); the bias is shared too
  // (cuBLASLt's BIAS_BATCH_STRIDE defaults to 0).
  if (p.batch > 1) {
    auto batch_of = [&](cublasLtMatrixLayout_t l, int64_t bs, const char* what) {
      const int32_t count = int32_t(p.batch);
      cublasStatus_t st =
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bs, sizeof(bs));
      return lt_status(st, what);
    };
    if (!(s = batch_of(d->la, p.b.bs, "batch layout (b)")).ok()) return s;
    if (!(s = batch_of(d->lb, p.a.bs, "batch layout (a)")).ok()) return s;
    if (!(s = batch_of(d->lc, p.out_bs, "batch layout (out)")).ok()) return s;
  }
  return Status::Ok();
}

// What decides cuBLASLt's choice: shapes, layouts, strides, alignments, dtype and epilogue.
std::string cache_key(const Prepared& w, GemmActivation act) {
  const GemmParams& p = w.p;
  std::string k;
  for (int64_t v : {int64_t(w.device),
                    int64_t(w.dtype),
                    int64_t(epilogue_of(p, act)),
                    p.M,
                    p.N,
                    p.K,
                    int64_t(p.a.row_major),
                    p.a.ld,
                    int64_t(p.b.row_major),
                    p.b.ld,
                    p.ldo,
                    int64_t(alignment(p.a.data)),
                    int64_t(alignment(p.b.data)),
                    int64_t(alignment(p.out)),
                    int64_t(p.aux != nullptr ? alignment(p.aux) : 0),
                    int64_t(p.bias != nullptr ? alignment(p.bias) : 0),
                    p.batch,
                    p.a.bs,
                    p.b.bs,
                    p.out_bs,
                    int64_t(p.accumulate)})
    k += std::to_string(v) + ",";
  return k;
}

// cuBLASLt's heuristic ranks its candidates without running them, and its first choice is not always the
// fastest: 4096 x 14336 x 4096's weight gradient (transposed operands) ran 753 us against cuBLAS's 659 on
// the H100. So the plan keeps up to kCandidates and the first run outside a CUDA-graph capture times each
// once on the call's own buffers (every output is rewritten by the final run) and keeps the fastest.
constexpr int kCandidates = 8;

struct Entry {
  cublasLtMatmulHeuristicResult_t cand[kCandidates];
  int count = 0;
  int chosen = 0;
  bool tuned = false;
};

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, Entry>& cache() {
  static std::map<std::string, Entry> c;
  return c;
}

GemmPlan plan_of(const Entry& e) {
  GemmPlan out;
  const cublasLtMatmulHeuristicResult_t& r = e.cand[e.chosen];
  static_assert(sizeof(out.algo) == sizeof(r.algo), "cublasLtMatmulAlgo_t is 8 words");
  std::memcpy(out.algo, &r.algo, sizeof(out.algo));
  out.tuned = e.tuned;
  out.workspace = r.workspaceSize;
  if (!e.tuned)  // room for every candidate, so that the run can time them
    for (int i = 0; i < e.count; ++i) out.workspace = std::max(out.workspace, e.cand[i].workspaceSize);
  auto config = [&](cublasLtMatmulAlgoConfigAttributes_t attr, int* v) {
    uint32_t x = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&r.algo, attr, &x, sizeof(x), &written) == CUBLAS_STATUS_SUCCESS)
      *v = int(x);
  };
  config(CUBLASLT_ALGO_CONFIG_ID, &out.algo_id);
  config(CUBLASLT_ALGO_CONFIG_TILE_ID, &out.tile);
  config(CUBLASLT_ALGO_CONFIG_STAGES_ID, &out.stages);
  config(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &out.split_k);
  return out;
}

// An accumulating product is never timed (each timed run would add into out): it takes the timed choice
// of the same product without accumulate when that one is cached and among its own candidates (the
// algorithms do not depend on beta), else the heuristic's first choice. Called with the cache locked.
void adopt_plain_choice(const Prepared& w, GemmActivation act, Entry* e) {
  Prepared plain = w;
  plain.p.accumulate = false;
  auto it = cache().find(cache_key(plain, act));
  if (it == cache().end() || !it->second.tuned) return;
  const cublasLtMatmulAlgo_t& want = it->second.cand[it->second.chosen].algo;
  for (int i = 0; i < e->count; ++i)
    if (std::memcmp(&e->cand[i].algo, &want, sizeof(want)) == 0) e->chosen = i;
}

Status heuristic(const Prepared& w, GemmActivation act, GemmPlan* plan) {
  const GemmParams& p = w.p;
  const std::string key = cache_key(w, act);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = cache().find(key);
    if (it != cache().end()) {
      if (p.accumulate) adopt_plain_choice(w, act, &it->second);  // the plain product may have been timed since
      *plan = plan_of(it->second);
      return Status::Ok();
    }
  }
  cublasLtHandle_t handle;
  Status s = handle_for(w.device, &handle);
  if (!s.ok()) return s;
  Desc d;
  if (!(s = make_desc(p, w.dtype, act, &d)).ok()) return s;
  cublasLtMatmulPreference_t pref = nullptr;
  if (!(s = lt_status(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")).ok()) return s;
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  };
  cublasStatus_t st = set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kGemmMaxWorkspace));
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(p.b.data));
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(p.a.data));
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(p.out));
  if (st == CUBLAS_STATUS_SUCCESS) st = set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(p.out));
  // Split-K partial sums reduced in float32 only: the in-place and output-type schemes add the partials in
  // the output dtype (bf16 / fp16), which the float32-accumulation contract forbids (7 x 129 outputs with
  // split_k = 264 came out 2 bf16 ulps off the reference on the H100).
  if (st == CUBLAS_STATUS_SUCCESS)
    st = set_pref(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                  uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  Entry e;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.la, d.lb, d.lc, d.lc, pref, kCandidates, e.cand, &e.count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && e.count == 0))
    return Status::NotSupported("gemm: cuBLASLt has no algorithm for M=" + std::to_string(p.M) +
                                " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) + " with epilogue " +
                                std::to_string(int(epilogue_of(p, act))) +
                                (p.aux != nullptr ? " (aux wants N % 8 == 0 and 16-byte alignment)" : "") +
                                (p.a_sum != nullptr ? " (a_sum wants a column-major a)" : ""));
  if (!(s = lt_status(st, "cublasLtMatmulAlgoGetHeuristic")).ok()) return s;
  e.tuned = e.count == 1 || p.accumulate;
  std::lock_guard<std::mutex> lock(cache_mutex());
  if (p.accumulate) adopt_plain_choice(w, act, &e);
  const Entry& stored = cache().emplace(key, e).first->second;
  *plan = plan_of(stored);
  return Status::Ok();
}

Status check_workspace(const GemmPlan& plan, const void* workspace, size_t bytes) {
  if (bytes < plan.workspace)
    return Status::Invalid("gemm: workspace_bytes must be at least " + std::to_string(plan.workspace) + " for plan " +
                           to_string(plan) + ", got " + std::to_string(bytes));
  if (plan.workspace > 0 && workspace == nullptr)
    return Status::Invalid("gemm: workspace must not be null: plan " + to_string(plan) + " needs " +
                           std::to_string(plan.workspace) + " bytes");
  if (plan.workspace > 0 && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return Status::Invalid("gemm: workspace must be 256-byte aligned");
  return Status::Ok();
}

// The family's own kernels (gemm_<dtype>.cu) for the calls with no product.
Status run_own(const Prepared& w, GemmActivation act, cudaStream_t stream) {
  const GemmParams& p = w.p;
  if (p.M == 0 || p.batch == 0 || p.accumulate) return Status::Ok();  // accumulate with K = 0 adds nothing
  if (p.K == 0) {  // one launch per batch: an edge case, the batch count is the caller's
    const size_t elt = dtype_size(w.dtype);
    for (int64_t i = 0; i < p.batch; ++i) {
      GemmParams one = p;
      one.batch = 1;
      one.out = static_cast<char*>(p.out) + i * p.out_bs * elt;
      if (p.aux != nullptr) one.aux = static_cast<char*>(p.aux) + i * p.M * p.N * elt;
      Status s = dispatch_dtype(w.dtype, "gemm",
                                [&](auto t) { return launch_gemm_fill<decltype(t)>(one, act, *w.dev, stream); });
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }
  if (p.a_sum != nullptr)  // N = 0: no output, the row sums alone
    return dispatch_dtype(w.dtype, "gemm", [&](auto t) { return launch_gemm_row_sum<decltype(t)>(p, *w.dev, stream); });
  return Status::Ok();
}

Status matmul(cublasLtHandle_t handle, const Desc& d, const GemmParams& p, const cublasLtMatmulAlgo_t& algo,
              void* workspace, size_t bytes, cudaStream_t stream) {
  const float one = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  return lt_status(cublasLtMatmul(handle, d.op, &one, p.b.data, d.la, p.a.data, d.lb, &beta, p.out, d.lc, p.out, d.lc,
                                  &algo, workspace, bytes, stream),
                   "cublasLtMatmul");
}

// Times every candidate of the problem's cache entry once on the call's buffers (after one warm-up run
// each) and keeps the fastest. Only outside a capture (it synchronizes); KF_GEMM_TUNE=0 turns it off.
Status tune(const Prepared& w, GemmActivation act, cublasLtHandle_t handle, const Desc& d, void* workspace,
            size_t bytes, cudaStream_t stream) {
  const char* env = std::getenv("KF_GEMM_TUNE");
  if (env != nullptr && std::string(env) == "0") return Status::Ok();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return Status::Ok();
  }
  const std::string key = cache_key(w, act);
  Entry e;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = cache().find(key);
    if (it == cache().end() || it->second.tuned) return Status::Ok();
    e = it->second;
  }
  cudaEvent_t t0, t1;
  if (cudaEventCreate(&t0) != cudaSuccess) return cuda_status(cudaGetLastError(), "gemm", "cudaEventCreate");
  if (cudaEventCreate(&t1) != cudaSuccess) {
    cudaEventDestroy(t0);
    return cuda_status(cudaGetLastError(), "gemm", "cudaEventCreate");
  }
  float best = -1.0f;
  int chosen = 0;
  Status s = Status::Ok();
  for (int i = 0; i < e.count && s.ok(); ++i) {
    if (e.cand[i].workspaceSize > bytes) continue;
    if (!(s = matmul(handle, d, w.p, e.cand[i].algo, workspace, bytes, stream)).ok()) break;  // warm-up
    cudaEventRecord(t0, stream);
    s = matmul(handle, d, w.p, e.cand[i].algo, workspace, bytes, stream);
    cudaEventRecord(t1, stream);
    float ms = 0.0f;
    if (s.ok() && cudaEventSynchronize(t1) == cudaSuccess && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess &&
        (best < 0.0f || ms < best)) {
      best = ms;
      chosen = i;
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(cache_mutex());
  Entry& stored = cache()[key];
  stored.chosen = chosen;
  stored.tuned = true;
  return Status::Ok();
}

Status run(const GemmPlan& plan, const Prepared& w, GemmActivation act, void* workspace, size_t bytes,
           cudaStream_t stream) {
  const GemmParams& p = w.p;
  if (!product(p)) return run_own(w, act, stream);
  if (plan.algo_id < 0) return Status::Invalid("gemm: plan " + to_string(plan) + " is for a call with no product");
  Status s = check_workspace(plan, workspace, bytes);
  if (!s.ok()) return s;
  cublasLtHandle_t handle;
  if (!(s = handle_for(w.device, &handle)).ok()) return s;
  Desc d;
  if (!(s = make_desc(p, w.dtype, act, &d)).ok()) return s;
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, plan.algo, sizeof(algo));
  if (!plan.tuned) {
    if (!(s = tune(w, act, handle, d, workspace, bytes, stream)).ok()) return s;
    GemmPlan now;
    if (!(s = heuristic(w, act, &now)).ok()) return s;  // the cached entry: the tuned choice
    if (now.workspace <= bytes) std::memcpy(&algo, now.algo, sizeof(algo));
  }
  return matmul(handle, d, p, algo, workspace, bytes, stream);
}

}  // namespace

Status gemm_plan(const GemmTensors& t, GemmActivation act, GemmPlan* plan, size_t* bytes) {
  if (plan == nullptr || bytes == nullptr)
    return Status::Invalid("gemm_plan: plan and workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(t, act, &w);
  if (!s.ok()) return s;
  *plan = GemmPlan();
  *bytes = 0;
  if (!product(w.p)) return Status::Ok();
  if (!(s = heuristic(w, act, plan)).ok()) return s;
  *bytes = plan->workspace;
  return Status::Ok();
}

Status gemm(const GemmPlan& plan, const GemmTensors& t, GemmActivation act, void* workspace, size_t bytes,
            cudaStream_t stream) {
  Prepared w;
  Status s = prepare(t, act, &w);
  if (!s.ok()) return s;
  return run(plan, w, act, workspace, bytes, stream);
}

Status gemm(const GemmTensors& t, GemmActivation act, void* workspace, size_t* bytes, cudaStream_t stream) {
  if (bytes == nullptr) return Status::Invalid("gemm: workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(t, act, &w);
  if (!s.ok()) return s;
  GemmPlan plan;
  if (product(w.p) && !(s = heuristic(w, act, &plan)).ok()) return s;
  if (workspace == nullptr) {  // the size query
    *bytes = plan.workspace;
    return Status::Ok();
  }
  return run(plan, w, act, workspace, *bytes, stream);
}

}  // namespace kernelforge
