// Public entry points of MLA decode (include/kernelforge/mla.h): validate (decode_validate.cpp), check
// the device, plan (mla_plan.cpp), launch (mla_launch.cuh) with the dtype dispatched once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/device.h"
#include "common/dispatch.h"
#include "decode/mla_plan.h"

namespace kernelforge {

template <typename T>
Status launch_mla_decode(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);
template <typename T>
bool mla_wgmma_image();

bool mla_decode_wgmma_image(DType dtype) {
  if (dtype == DType::kBFloat16) return mla_wgmma_image<__nv_bfloat16>();
  if (dtype == DType::kFloat16) return mla_wgmma_image<__half>();
  return false;
}

namespace {

struct Prepared {
  DecodeParams p;
  DType dtype = DType::kFloat16;
  const DeviceInfo* dev = nullptr;
  bool wgmma_image = false;     // the library's sm_90a image of the wgmma kernel runs on this device
  bool wgmma_default = false;   // ... and the calls' planner may pick it
  bool seesaw_default = false;  // ... in its seesaw schedule
};

Status prepare(const MlaDecodeCall& c, Prepared* w) {
  Status s = validate_mla_decode(c, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, c.t.q->device.index, w->dtype, &w->dev)).ok()) return s;
  if (w->dev->capability < 80)  // mma.sync m16n8k16, cp.async and the shared memory of the tile
    return Status::NotSupported(std::string(c.name) + ": MLA decode needs sm_80 or later, this GPU is sm_" +
                                std::to_string(w->dev->capability));
  w->wgmma_image = w->dev->capability == 90 && mla_decode_wgmma_image(w->dtype);
  // What the calls' planner may pick (mla_plan.h: kMlaWgmmaByDefault; KF_MLA_WGMMA=1 or 0 overrides it,
  // read once).
  static const bool on = env_switch("KF_MLA_WGMMA", kMlaWgmmaByDefault);
  w->wgmma_default = on && w->wgmma_image;
  // The seesaw schedule of the wgmma kernel (mla_plan.h: kMlaSeesawByDefault; KF_MLA_SEESAW=1 or 0
  // overrides it, read once).
  static const bool seesaw = env_switch("KF_MLA_SEESAW", kMlaSeesawByDefault);
  w->seesaw_default = seesaw;
  return Status::Ok();
}

bool empty(const DecodeParams& p) { return p.batch == 0; }

Status launch(const MlaDecodePlan& plan, const MlaDecodeCall& c, const Prepared& w, void* workspace,
              cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same<T, float>::value) {  // validation admits only float16 / bfloat16 on CUDA
      return Status::Invalid(std::string(c.name) + ": q must be float16 or bfloat16, got float32");
    } else {
      return launch_mla_decode<T>(plan, w.p, workspace, stream);
    }
  });
}

MlaDecodeCall make_call(const char* name, const MlaDecodeTensors& t, const MlaDecodeOptions& opts) {
  MlaDecodeCall c;
  c.name = name;
  c.t = t;
  c.opts = opts;
  return c;
}

}  // namespace

Status mla_decode_plan(const MlaDecodeTensors& t, const MlaDecodeOptions& opts, MlaDecodePlan* plan, size_t* bytes) {
  if (plan == nullptr || bytes == nullptr)
    return Status::Invalid("mla_decode_plan: plan and workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(make_call("mla_decode_plan", t, opts), &w);
  if (!s.ok()) return s;
  *plan = plan_mla_decode(w.p, *w.dev, w.wgmma_default, w.seesaw_default);
  if (empty(w.p)) {
    *bytes = 0;
    return Status::Ok();
  }
  if (!(s = check_mla_decode_plan(*plan, w.p, *w.dev, w.wgmma_image)).ok()) return s;
  *bytes = mla_decode_workspace_bytes(*plan, w.p);
  return Status::Ok();
}

Status mla_decode(const MlaDecodePlan& plan, const MlaDecodeTensors& t, const MlaDecodeOptions& opts, void* workspace,
                  size_t bytes, cudaStream_t stream) {
  const MlaDecodeCall c = make_call("mla_decode", t, opts);
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.p)) return Status::Ok();
  if (!(s = check_mla_decode_plan(plan, w.p, *w.dev, w.wgmma_image)).ok())
    return Status(s.code(), s.message() + " (pass a plan from mla_decode_plan for the same shapes)");
  if (!(s = check_decode_workspace(c.name, to_string(plan), mla_decode_workspace_bytes(plan, w.p), workspace, bytes))
           .ok())
    return s;
  return launch(plan, c, w, workspace, stream);
}

Status mla_decode(const MlaDecodeTensors& t, const MlaDecodeOptions& opts, void* workspace, size_t* bytes,
                  cudaStream_t stream) {
  const MlaDecodeCall c = make_call("mla_decode", t, opts);
  if (bytes == nullptr) return Status::Invalid("mla_decode: workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.p)) {
    if (workspace == nullptr) *bytes = 0;
    return Status::Ok();
  }
  const MlaDecodePlan plan = plan_mla_decode(w.p, *w.dev, w.wgmma_default, w.seesaw_default);
  if (!(s = check_mla_decode_plan(plan, w.p, *w.dev, w.wgmma_image)).ok()) return s;
  const size_t need = mla_decode_workspace_bytes(plan, w.p);
  if (workspace == nullptr) {  // CUB's size query
    *bytes = need;
    return Status::Ok();
  }
  if (!(s = check_decode_workspace(c.name, to_string(plan), need, workspace, *bytes)).ok()) return s;
  return launch(plan, c, w, workspace, stream);
}

}  // namespace kernelforge
