// Per-device facts the launchers need, read once per device and cached.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

struct DeviceInfo {
  int sm_count = 0;
  int capability = 0;  // major * 10 + minor
  int max_threads_per_sm = 0;
  int l2_bytes = 0;
};

// Info of the current CUDA device (cudaGetDevice); `device` receives its ordinal.
Status current_device_info(int* device, const DeviceInfo** info);

// The device check every public entry makes after validating its arguments: a GPU is present, the
// tensors sit on the current device (`device_index`), and the dtype runs on it (bfloat16 needs sm_80).
// `op` names the entry in the message; `info` receives the current device's facts.
Status check_device(const char* op, int device_index, DType dtype, const DeviceInfo** info);

// A kernel switch from the environment: `name`=1 turns it on, 0 off; unset or any other value leaves
// `fallback`. Read where a caller asks; callers that keep it for the process read it once.
bool env_switch(const char* name, bool fallback);

// Programmatic dependent launch (common/launch.cuh) is a process-wide switch: kPdlByDefault, or the
// environment variable KF_PDL=1 / KF_PDL=0 (read once, at the first launch), or set_pdl_override.
// Launchers apply it only on devices of compute capability 9.0 or newer (use_pdl).
constexpr bool kPdlByDefault = true;
bool pdl_switch();
// 1 forces the switch on, 0 off, -1 returns to KF_PDL / kPdlByDefault. For tests that compare a chain
// of kernels with and without the attribute in one process; a captured CUDA graph keeps the attributes
// it was captured with.
void set_pdl_override(int on);
// The switch and the current device's compute capability (>= 9.0): whether launches carry the attribute.
bool pdl_enabled();

// Converts a CUDA error into a Status naming the operation.
inline Status cuda_status(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Cuda(std::string(op) + ": " + what + " failed: " + cudaGetErrorString(err));
}

}  // namespace kernelforge
