// Admin (status, scale, drain, stop): what the coordinator's parts say to an operator. Pure
// functions of the roster, the generations, the step driver and the config; the actor acts on
// the scale and drain decisions (elastic/scaling.h) they feed.
#pragma once

#include <string>
#include <vector>

#include "actors/job_protocol.h"
#include "coordinator/config.h"
#include "coordinator/generations.h"
#include "coordinator/roster.h"
#include "coordinator/step_driver.h"
#include "elastic/job_phase.h"
#include "elastic/scaling.h"

namespace troupe::coordinator {

// `troupe status`: the phase, the generation and its members by rank, the standbys. draining:
// the agents asked to leave at the next step boundary (members until then).
actors::JobStatus job_status(const JobConfig& config, const elastic::JobLifecycle& job,
                             const Roster& roster, const Generations& generations,
                             const StepDriver& steps, const std::string& plan,
                             const std::vector<uint32_t>& draining);

// The live agents as elastic::decide_scale and decide_drain see them (in join order).
std::vector<elastic::LiveAgent> live_agents(const Roster& roster, const Generations& generations);

// The limits scale and drain requests are held to.
// (run_dir: where agents started by hand find the address and token, for the refusal's hint)
elastic::ScaleLimits scale_limits(const JobConfig& config, uint32_t min_workers,
                                  const std::string& run_dir = "");

}  // namespace troupe::coordinator
