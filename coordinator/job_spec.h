// The job as its workers see it: JobConfig (TOML, read only by the coordinator) -> the JobSpec a
// joining agent receives.
#pragma once

#include "actors/job_protocol.h"
#include "coordinator/config.h"

namespace troupe::coordinator {

actors::JobSpec job_spec_of(const JobConfig& config, uint32_t agent_id, uint64_t first_generation);

}  // namespace troupe::coordinator
