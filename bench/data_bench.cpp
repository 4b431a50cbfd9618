// troupe bench data: how fast a worker gets its micro-batches from a token data set — the path
// a training step takes (workers::open_dataset, models::make_batch: windows located in the
// global order, read from the mapped shards, turned into the model's input and targets).
// bench/compare_data.sh runs it next to PyTorch's DataLoader over a numpy.memmap.
#include <chrono>
#include <cstdio>

#include "bench/bench.h"
#include "cli/parse.h"
#include "models/data.h"
#include "workers/datasets.h"

namespace troupe::bench {

int run_data_bench(const std::vector<std::string>& words) {
  CLI::App app{"Micro-batches per second from a token data set, as a worker assembles them.",
               "troupe bench data"};
  workers::WorkerSpec spec;
  spec.data_kind = "tokens";
  size_t context = 1024, batch = 8;
  double seconds = 3;
  bool json = false;
  app.add_option("--data", spec.data_path, "a data set made by troupe data prepare")->required();
  app.add_option("--context", context, "tokens per window, less one")->check(cli::kPositive);
  app.add_option("--batch", batch, "windows per micro-batch")->check(cli::kPositive);
  app.add_option("--seconds", seconds, "how long to measure")->check(cli::kPositive);
  app.add_option("--seed", spec.seed, "the order's seed");
  app.add_flag("--json", json, "one JSON line");
  if (auto rc = cli::parse(app, words)) return *rc;
  models::ModelSpec m;
  m.kind = "gpt";
  m.context = context;
  const auto data = workers::open_dataset(spec, m);
  models::GlobalSampler sampler(spec.seed, data->size());
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  uint64_t batches = 0, checksum = 0;
  double elapsed = 0;
  while (elapsed < seconds) {  // (the clock read each batch: 16 at a time ran 24 s of 0.3)
    const models::Batch b =
        models::make_batch(*data, sampler, batches * batch, (batches + 1) * batch);
    checksum += uint64_t(b.targets.back());
    ++batches;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double tokens_per_s = double(batches * batch * context) / elapsed;
  const double batch_us = elapsed / double(batches) * 1e6;
  if (json) {
    std::printf(
        "{\"bench\":\"data\",\"impl\":\"troupe\",\"context\":%zu,\"batch\":%zu,"
        "\"batches\":%llu,\"tokens_per_s\":%.0f,\"batch_time_us\":%.2f,\"checksum\":%llu}\n",
        context, batch, (unsigned long long)batches, tokens_per_s, batch_us,
        (unsigned long long)checksum);
  } else {
    std::printf("%llu micro-batches of %zu x %zu tokens: %.3g tokens/s, %.1f us a micro-batch\n",
                (unsigned long long)batches, batch, context, tokens_per_s, batch_us);
  }
  return 0;
}

}  // namespace troupe::bench
