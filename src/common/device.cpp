#include "common/device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernelforge/kernelforge.h"

namespace kernelforge {

namespace {
constexpr int kMaxDevices = 64;
DeviceInfo g_info[kMaxDevices];
std::atomic<bool> g_ready[kMaxDevices];
std::mutex g_mutex;
std::atomic<int> g_pdl_override{-1};

}  // namespace

bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && (std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0) ? e[0] == '1' : fallback;
}

bool pdl_switch() {
  static const bool env = env_switch("KF_PDL", kPdlByDefault);
  const int o = g_pdl_override.load(std::memory_order_relaxed);
  return o < 0 ? env : o != 0;
}

void set_pdl_override(int on) { g_pdl_override.store(on < 0 ? -1 : (on != 0 ? 1 : 0), std::memory_order_relaxed); }

bool pdl_enabled() {
  int device = 0;
  const DeviceInfo* info = nullptr;
  if (!current_device_info(&device, &info).ok()) return false;
  return info->capability >= 90 && pdl_switch();
}

Status current_device_info(int* device, const DeviceInfo** info) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error for later calls
    return cuda_status(err, "kernelforge", "cudaGetDevice (is a CUDA GPU present?)");
  }
  if (dev < 0 || dev >= kMaxDevices) return Status::NotSupported("kernelforge: device ordinal too large");
  if (!g_ready[dev].load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_ready[dev].load(std::memory_order_relaxed)) {
      DeviceInfo d;
      int major = 0, minor = 0;
      err = cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
      if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, dev);
      if (err != cudaSuccess) return cuda_status(err, "kernelforge", "cudaDeviceGetAttribute");
      d.capability = major * 10 + minor;
      g_info[dev] = d;
      g_ready[dev].store(true, std::memory_order_release);
    }
  }
  *device = dev;
  *info = &g_info[dev];
  return Status::Ok();
}

Status check_device(const char* op, int device_index, DType dtype, const DeviceInfo** info) {
  int dev = 0;
  Status s = current_device_info(&dev, info);
  if (!s.ok()) return Status(s.code(), std::string(op) + ": " + s.message());
  if (device_index != dev)
    return Status::Invalid(std::string(op) + ": the tensors are on cuda:" + std::to_string(device_index) +
                           " but the current CUDA device is cuda:" + std::to_string(dev));
  if (dtype == DType::kBFloat16 && (*info)->capability < 80)
    return Status::NotSupported(std::string(op) +
                                ": bfloat16 needs a GPU of compute capability 8.0 or newer, this one is sm_" +
                                std::to_string((*info)->capability) + "; use float16 or float32");
  return Status::Ok();
}

Status device_capability(int device, int* capability) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(err, "kernelforge", "cudaDeviceGetAttribute");
  }
  *capability = major * 10 + minor;
  return Status::Ok();
}

}  // namespace kernelforge
