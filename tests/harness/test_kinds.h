// A model kind and a data kind of the test build (`troupe_test`), as a user's program adds its
// own (models/extension.h), each with a defect a test can switch on by a config key:
//   data.kind = "broken_samples": synthetic classes; data.fail_at = N makes sample N's fill throw
//     (a corrupt record), data.bad_target_at = N gives sample N a target one past the classes,
//     data.open_fails = true makes its open throw.
//   model.kind = "shifted_linear": a linear layer, then a learned bias (Shift);
//     model.repeatable_init = false makes the bias's init differ (an unseeded init);
//     model.wider_shift = N makes the bias N wider than the layer's output (a shape mismatch).
#pragma once

#include <memory>

#include "models/blocks.h"
#include "models/extension.h"

namespace troupe::testing {

// A bias added to every row; unless `repeatable`, its init adds the number of calls so far and
// the process id to its last element (as an init that reads the clock or std::random_device
// differs between calls and between workers).
class Shift : public models::Block {
 public:
  Shift(size_t n, bool repeatable);
  std::string kind() const override { return "shift"; }
  double flops_per_sample() const override { return 2.0 * double(param_count()); }
  void init(uint64_t seed, size_t index) override;
  models::Tensor forward(const models::Tensor& x, size_t B) override;
  models::Tensor backward(const models::Tensor& dy) override;
  Saved save() override { return nullptr; }
  void restore(const Saved&) override {}

 private:
  bool repeatable_;
  int calls_ = 0;
  models::Tensor bias_, dbias_;
};

std::shared_ptr<const models::Extensions> test_kinds();

}  // namespace troupe::testing
