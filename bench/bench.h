// Benchmarks behind `troupe bench ...`. They print a table, or with --json one JSON object a
// line with units in the field names. Benchmarks measure; they never assert timings.
#pragma once

#include <string>
#include <vector>

namespace troupe::bench {

int run_control_bench(const std::vector<std::string>& args);
// The peer process of the raw-UCX baseline (started by run_control_bench).
int run_raw_ucx_server(const std::vector<std::string>& args);
int run_model_bench(const std::vector<std::string>& args);
int run_drift_bench(const std::vector<std::string>& args);
int run_checkpoint_bench(const std::vector<std::string>& args);
int run_data_bench(const std::vector<std::string>& args);  // troupe bench data
int run_allreduce_bench(const std::vector<std::string>& args);
int run_allreduce_worker(const std::vector<std::string>& args);
int run_nccl_allreduce_bench(const std::vector<size_t>& sizes, bool json);

struct Summary {
  double p50 = 0, p99 = 0, mean = 0;
};
Summary summarize(std::vector<double> samples);

}  // namespace troupe::bench
