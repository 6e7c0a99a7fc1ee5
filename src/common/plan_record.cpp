#include "common/plan_record.h"

#include "kernelforge/kernelforge.h"

namespace kernelforge {

PlanRecord& plan_record() {
  thread_local PlanRecord record;
  return record;
}

std::string last_plan() {
  const PlanRecord& r = plan_record();
  return r.format ? r.format(r.bytes) : std::string();
}

}  // namespace kernelforge
