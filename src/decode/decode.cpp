// Public entry points of the decode family: validate (decode_validate.cpp), check the device, plan
// (decode_plan.cpp), launch (decode_launch.cuh, kv_append.cu, rope_kv_append.cu) with the dtype dispatched once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/device.h"
#include "common/dispatch.h"
#include "decode/decode_plan.h"

namespace kernelforge {

template <typename T>
Status launch_decode_attention(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);
Status launch_kv_append(const KvAppendParams& p, cudaStream_t stream);
Status launch_rope_kv_append(const RopeKvAppendParams& p, DType dtype, DType cs_dtype, cudaStream_t stream);

namespace {

struct Prepared {
  DecodeParams p;
  DType dtype = DType::kFloat16;
  const DeviceInfo* dev = nullptr;
};

Status prepare(const DecodeCall& c, Prepared* w) {
  Status s = validate_decode(c, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, c.t.q->device.index, w->dtype, &w->dev)).ok()) return s;
  if (w->dev->capability < 80)  // mma.sync m16n8k16 and cp.async
    return Status::NotSupported(std::string(c.name) + ": decode attention needs sm_80 or later, this GPU is sm_" +
                                std::to_string(w->dev->capability));
  return Status::Ok();
}

bool empty(const DecodeParams& p) { return p.batch == 0 || p.heads_q == 0; }

// The TMA kernel's image runs on this device (asked only of sm_90 devices).
bool tma_built(const DeviceInfo& dev) { return dev.capability == 90 && decode_tma_built(); }
// What the calls' planner may pick (decode_plan.h: kDecodeTmaByDefault; KF_DECODE_TMA=1 or 0 overrides it,
// read once: the bench and the tests time and check either kernel through the public entries).
bool tma_default(const DeviceInfo& dev) {
  static const bool on = env_switch("KF_DECODE_TMA", kDecodeTmaByDefault);
  return on && tma_built(dev);
}
// Whether page size 1 may take the head-group kernel (decode_plan.h: kDecodeHeadGroupByDefault;
// KF_DECODE_HEADS=1 or 0 overrides it, read once).
bool head_group_default() {
  static const bool on = env_switch("KF_DECODE_HEADS", kDecodeHeadGroupByDefault);
  return on;
}

Status launch(const DecodePlan& plan, const DecodeCall& c, const Prepared& w, void* workspace, cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same<T, float>::value) {  // validation admits only float16 / bfloat16 on CUDA
      return Status::Invalid(std::string(c.name) + ": q must be float16 or bfloat16, got float32");
    } else {
      return launch_decode_attention<T>(plan, w.p, workspace, stream);
    }
  });
}

DecodeCall make_call(const char* name, const DecodeTensors& t, const DecodeOptions& opts) {
  DecodeCall c;
  c.name = name;
  c.t = t;
  c.opts = opts;
  return c;
}

}  // namespace

Status check_decode_workspace(const char* name, const std::string& plan, size_t need, const void* workspace,
                              size_t bytes) {
  if (bytes < need)
    return Status::Invalid(std::string(name) + ": workspace_bytes must be at least " + std::to_string(need) +
                           " for plan " + plan + ", got " + std::to_string(bytes));
  if (need > 0 && workspace == nullptr)
    return Status::Invalid(std::string(name) + ": workspace must not be null: plan " + plan + " needs " +
                           std::to_string(need) + " bytes");
  if (need > 0 && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return Status::Invalid(std::string(name) + ": workspace must be 256-byte aligned");
  return Status::Ok();
}

Status decode_attention_plan(const DecodeTensors& t, const DecodeOptions& opts, DecodePlan* plan, size_t* bytes) {
  if (plan == nullptr || bytes == nullptr)
    return Status::Invalid("decode_attention_plan: plan and workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(make_call("decode_attention_plan", t, opts), &w);
  if (!s.ok()) return s;
  *plan = plan_decode(w.p, *w.dev, tma_default(*w.dev), head_group_default());
  if (empty(w.p)) {
    *bytes = 0;
    return Status::Ok();
  }
  if (!(s = check_decode_plan(*plan, w.p)).ok()) return s;
  *bytes = decode_workspace_bytes(*plan, w.p);
  return Status::Ok();
}

Status decode_attention(const DecodePlan& plan, const DecodeTensors& t, const DecodeOptions& opts, void* workspace,
                        size_t bytes, cudaStream_t stream) {
  const DecodeCall c = make_call("decode_attention", t, opts);
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.p)) return Status::Ok();
  if (!(s = check_decode_plan(plan, w.p)).ok())
    return Status(s.code(), s.message() + " (pass a plan from decode_attention_plan for the same shapes)");
  if (!(s = check_decode_workspace(c.name, to_string(plan), decode_workspace_bytes(plan, w.p), workspace, bytes)).ok())
    return s;
  return launch(plan, c, w, workspace, stream);
}

Status decode_attention(const DecodeTensors& t, const DecodeOptions& opts, void* workspace, size_t* bytes,
                        cudaStream_t stream) {
  const DecodeCall c = make_call("decode_attention", t, opts);
  if (bytes == nullptr) return Status::Invalid("decode_attention: workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.p)) {
    if (workspace == nullptr) *bytes = 0;
    return Status::Ok();
  }
  const DecodePlan plan = plan_decode(w.p, *w.dev, tma_default(*w.dev), head_group_default());
  if (!(s = check_decode_plan(plan, w.p)).ok()) return s;
  const size_t need = decode_workspace_bytes(plan, w.p);
  if (workspace == nullptr) {  // CUB's size query
    *bytes = need;
    return Status::Ok();
  }
  if (!(s = check_decode_workspace(c.name, to_string(plan), need, workspace, *bytes)).ok()) return s;
  return launch(plan, c, w, workspace, stream);
}

Status kv_append(const KvAppendTensors& t, cudaStream_t stream) {
  KvAppendParams p;
  DType dtype = DType::kFloat16;
  Status s = validate_kv_append("kv_append", true, t, &p, &dtype);
  if (!s.ok()) return s;
  const DeviceInfo* dev = nullptr;
  if (!(s = check_device("kv_append", t.k->device.index, dtype, &dev)).ok()) return s;
  return launch_kv_append(p, stream);
}

Status rope_kv_append(const RopeKvAppendTensors& t, cudaStream_t stream) {
  RopeKvAppendParams p;
  DType dtype = DType::kFloat16, cs_dtype = DType::kFloat32;
  Status s = validate_rope_kv_append("rope_kv_append", true, t, &p, &dtype, &cs_dtype);
  if (!s.ok()) return s;
  const DeviceInfo* dev = nullptr;
  if (!(s = check_device("rope_kv_append", t.k->device.index, dtype, &dev)).ok()) return s;
  return launch_rope_kv_append(p, dtype, cs_dtype, stream);
}

}  // namespace kernelforge
