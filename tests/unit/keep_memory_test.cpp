// models::keep_freed_memory: once training is warm (the allocator's free lists settle over the
// first steps), the next steps take no new pages from the kernel (glibc's defaults give freed
// buffers above 128 KiB back and fault them in again: ~15 page faults a step for this MLP).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "models/data.h"
#include "models/model.h"
#include "models/trainer.h"

namespace troupe::models {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(KeepFreedMemory, TrainingStepsFaultNoPagesOnceWarm) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator replaces glibc's: mallopt does not apply";
#endif
  keep_freed_memory();
  ModelSpec spec;
  spec.kind = "mlp";
  spec.mlp_sizes = {300, 500, 500, 10};  // (activations and batches of 100-500 KiB a step)
  SyntheticClassification data(1, 4096, 300, 10);
  OptimizerSpec os;
  os.kind = "sgd";
  os.lr = 0.01;
  Model m(spec);
  Optimizer opt(os, m.block_param_counts());
  m.init(3);
  Trainer t(m, opt, data, 7, 256, 256);
  for (uint64_t s = 0; s < 30; ++s) t.step(s);
  const long before = minor_faults();
  const int steps = 20;
  for (uint64_t s = 30; s < 30 + steps; ++s) t.step(s);
  const long faults = minor_faults() - before;
  // Without it: ~300 here. A few stray ones allowed (the test runner, the allocator's books).
  EXPECT_LT(faults, steps) << faults << " page faults in " << steps << " steps";
}

}  // namespace
}  // namespace troupe::models
