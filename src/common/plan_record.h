// The plan of the last launch on this thread, kept as a copy of the plan value and formatted only
// when asked (kernelforge::last_plan()): failing tests, `kforge bench --plan` and bug reports print
// it. Recording costs a 64-byte copy, nothing a decode-sized call notices.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>

namespace kernelforge {

struct PlanRecord {
  std::string (*format)(const void*) = nullptr;
  alignas(8) unsigned char bytes[96];
};

PlanRecord& plan_record();  // this thread's record (common/plan_record.cpp)

template <typename Plan>
void record_plan(const Plan& plan) {
  static_assert(std::is_trivially_copyable<Plan>::value && sizeof(Plan) <= sizeof(PlanRecord::bytes),
                "a plan is a small trivially copyable value");
  PlanRecord& r = plan_record();
  r.format = [](const void* b) {
    Plan p;
    std::memcpy(&p, b, sizeof(Plan));
    return to_string(p);
  };
  std::memcpy(r.bytes, &plan, sizeof(Plan));
}

}  // namespace kernelforge
