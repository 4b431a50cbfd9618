#include "coordinator/job_spec.h"

namespace troupe::coordinator {

// (Paths as the coordinator resolves them, absolute_path: an agent started in another directory,
// `troupe agent --join`, reads the same files; it read a relative one from its own, or none.)

actors::JobSpec job_spec_of(const JobConfig& c, uint32_t agent_id, uint64_t first_generation) {
  actors::JobSpec s;
  s.agent_id = agent_id;
  s.first_generation = first_generation;
  s.job_name = c.name;
  s.seed = uint64_t(c.seed);
  s.steps = uint64_t(c.steps);
  s.model_kind = c.model_kind;
  s.hidden = c.hidden;
  s.inputs = c.inputs;
  s.classes = c.classes;
  s.layers = c.layers;
  s.d_model = c.d_model;
  s.heads = c.heads;
  s.context = c.context;
  s.tied_head = c.tied_head;
  s.dtype = c.dtype;
  s.backend = c.backend;
  s.reduce_dtype = c.reduce_dtype;
  s.block_params = c.block_params;
  s.data_kind = c.data_kind;
  s.data_path = absolute_path(c.data_path);
  s.eval_every = c.eval_every_steps;
  s.eval_path = absolute_path(c.eval_path);
  s.eval_fraction = c.eval_fraction;
  s.model_options = c.model_options;
  s.data_options = c.data_options;
  for (const auto& [dir, w] : c.data_mix) {
    s.data_mix.push_back(absolute_path(dir));  // (in the coordinator's order: the sampler's)
    s.data_mix_weights.push_back(w);
  }
  s.samples = c.samples;
  s.global_batch = c.global_batch;
  s.micro_batch = c.micro_batch;
  s.optimizer = c.optimizer;
  s.lr = c.lr;
  s.momentum = c.momentum;
  s.weight_decay = c.weight_decay;
  s.clip_norm = c.clip_norm;
  s.warmup_steps = c.warmup_steps;
  s.decay_steps = c.decay_steps;
  s.threads_per_worker = c.threads_per_worker;
  s.overlap_reduce = c.overlap_reduce;
  s.deterministic = c.deterministic;
  s.checkpoint_dir = c.checkpoint_dir;  // (resolved by then; "" only outside troupe run)
  s.checkpoint_every = c.checkpoint_every_steps;
  s.checkpoint_skip_if_busy = c.checkpoint_if_busy == "skip";
  s.resume_dir = c.resume_dir;
  s.resume_step = c.resume_step;
  s.trace_first = c.trace_first;
  s.peak_tflops = c.peak_tflops;
  s.log_level = c.log_level;
  s.trace_last = c.trace_last;
  s.pipeline_stages = c.pipeline_stages;
  s.max_params_per_worker = c.max_params_per_worker;
  s.stage_backup_steps = c.stage_backup_steps;
  s.recompute_activations = c.recompute_activations;
  s.failure_timeout_ms = c.failure_timeout_ms;
  s.heartbeat_interval_ms = c.heartbeat_interval_ms;
  s.worker_max_restarts = c.worker_max_restarts;
  s.worker_restart_window_ms = c.worker_restart_window_ms;
  s.rejoin_timeout_ms = c.rejoin_timeout_ms;
  s.init_state = first_generation == 1;
  return s;
}

}  // namespace troupe::coordinator
