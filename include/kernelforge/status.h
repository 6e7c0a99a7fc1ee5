// kernelforge status: every API call returns one; a failed call carries a message that names the
// argument and what was expected, e.g.
//   "rms_norm: weight must have shape [4096] to match the last dimension of x, got [4095]"
#pragma once

#include <string>
#include <utility>

namespace kernelforge {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad dtype, shape, stride, alignment, device, size
  kNotSupported = 2,     // valid input this build or GPU cannot run (e.g. bfloat16 on sm_75)
  kCudaError = 3,        // a CUDA runtime call failed
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status Invalid(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
  static Status NotSupported(std::string m) { return Status(StatusCode::kNotSupported, std::move(m)); }
  static Status Cuda(std::string m) { return Status(StatusCode::kCudaError, std::move(m)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace kernelforge
