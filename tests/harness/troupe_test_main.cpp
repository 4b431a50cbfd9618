// troupe_test: the `troupe` command of the test build. The same dispatch as the release binary,
// plus a fault injector read from TROUPE_TEST_* (env_faults.h) for the agents' workers, and a
// data kind of its own as a user's program adds one (models/extension.h). The integration tests
// run this binary; `troupe run` starts its agents from it too.
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "models/data.h"
#include "models/extension.h"
#include "tests/harness/env_faults.h"

namespace {

// data.kind = "broken_samples": synthetic classes whose sample `fail_at` cannot be read (its
// fill throws, as a user's reader does on a corrupt record) and whose sample `bad_target_at`
// has a target one past the classes (a label the model has no output for); -1: none.
class BrokenSamples : public troupe::models::SyntheticClassification {
 public:
  BrokenSamples(uint64_t seed, const troupe::models::Options& o)
      : SyntheticClassification(seed, size_t(o.integer("samples")), size_t(o.integer("dim")),
                                size_t(o.integer("classes"))),
        classes_(int32_t(o.integer("classes"))),
        fail_at_(o.integer("fail_at")),
        bad_target_at_(o.integer("bad_target_at")) {}
  void fill(size_t index, float* input, int32_t* targets) const override {
    if (int64_t(index) == fail_at_)
      throw std::runtime_error("record " + std::to_string(index) + " is corrupt (a test's)");
    SyntheticClassification::fill(index, input, targets);
    if (int64_t(index) == bad_target_at_) targets[0] = classes_;
  }
  size_t classes() const override { return 0; }  // (not known: the model's check finds it)

 private:
  int32_t classes_;
  int64_t fail_at_, bad_target_at_;
};

std::shared_ptr<const troupe::models::Extensions> test_kinds() {
  auto ext = std::make_shared<troupe::models::Extensions>();
  ext->add_dataset({"broken_samples",
                    {{"samples", int64_t(512), 1, 1e9, "samples per epoch"},
                     {"dim", int64_t(64), 1, 4096, "features per sample"},
                     {"classes", int64_t(10), 2, 1000, "classes"},
                     {"fail_at", int64_t(-1), -1, 1e9, "the sample whose fill throws"},
                     {"bad_target_at", int64_t(-1), -1, 1e9, "the sample of a bad target"}},
                    [](const troupe::models::Options& o, uint64_t seed) {
                      return std::make_unique<BrokenSamples>(seed, o);
                    },
                    "synthetic classes with a sample that fails (tests)"});
  return ext;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::cli::Hooks hooks;
  hooks.faults = [] { return troupe::testing::faults_from_environment(); };
  hooks.extensions = test_kinds();
  return troupe::cli::troupe_main(argc, argv, hooks);
}
