#include "tests/harness/test_kinds.h"

#include <fcntl.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <tuple>

#include "models/data.h"

namespace troupe::testing {
namespace {

class BrokenSamples : public models::SyntheticClassification {
 public:
  BrokenSamples(uint64_t seed, const models::Options& o)
      : SyntheticClassification(seed, size_t(o.integer("samples")), size_t(o.integer("dim")),
                                size_t(o.integer("classes"))),
        classes_(int32_t(o.integer("classes"))),
        fail_at_(o.integer("fail_at")),
        bad_target_at_(o.integer("bad_target_at")),
        hang_at_(o.integer("hang_at")),
        hang_file_(o.string("hang_file")) {}
  void fill(size_t index, float* input, int32_t* targets) const override {
    if (int64_t(index) == hang_at_) hang_once();
    if (int64_t(index) == fail_at_)
      throw std::runtime_error("record " + std::to_string(index) + " is corrupt (a test's)");
    SyntheticClassification::fill(index, input, targets);
    if (int64_t(index) == bad_target_at_) targets[0] = classes_;
  }
  size_t classes() const override { return 0; }  // (not known: the model's check finds it)

  // Hung: the first fill of the sample, in whichever process, never returns while hang_file
  // exists (a day at most); the others go on (the job can finish without the hung worker).
  void hang_once() const {
    if (::access(hang_file_.c_str(), F_OK) != 0) return;
    const int claimed = ::open((hang_file_ + ".taken").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (claimed < 0) return;
    ::close(claimed);
    for (int s = 0; s < 86400 * 50 && ::access(hang_file_.c_str(), F_OK) == 0; ++s) ::usleep(20000);
  }

 private:
  int32_t classes_;
  int64_t fail_at_, bad_target_at_, hang_at_;
  std::string hang_file_;
};

models::DatasetKind broken_samples() {
  return {"broken_samples",
          {{"samples", int64_t(512), 1, 1e9, "samples per epoch"},
           {"dim", int64_t(64), 1, 4096, "features per sample"},
           {"classes", int64_t(10), 2, 1000, "classes"},
           {"fail_at", int64_t(-1), -1, 1e9, "the sample whose fill throws"},
           {"bad_target_at", int64_t(-1), -1, 1e9, "the sample of a bad target"},
           {"hang_at", int64_t(-1), -1, 1e9,
            "the sample whose first fill hangs while hang_file exists"},
           {"hang_file", std::string(""), "see hang_at"},
           {"open_fails", false, "true: its open throws (records it cannot read)"}},
          [](const models::Options& o, uint64_t seed) {
            if (o.boolean("open_fails"))
              throw std::invalid_argument("cannot open /nonexistent/records.csv");
            return std::make_unique<BrokenSamples>(seed, o);
          },
          "synthetic classes with a sample that fails (tests)"};
}

models::ModelKind shifted_linear() {
  return {"shifted_linear",
          {{"classes", int64_t(10), 2, 1000, "outputs"},
           {"repeatable_init", true, "false: the bias's init differs at each call"},
           {"wider_shift", int64_t(0), 0, 10, "the bias this much wider than its input"}},
          [](const models::Options& o, const models::Dataset& data) {
            const size_t classes = size_t(o.integer("classes"));
            std::vector<std::unique_ptr<models::Block>> blocks;
            blocks.push_back(models::make_linear_block(data.input_width(), classes, false));
            blocks.push_back(std::make_unique<Shift>(classes + size_t(o.integer("wider_shift")),
                                                     o.boolean("repeatable_init")));
            return blocks;
          },
          "a linear layer and a bias (tests)"};
}

}  // namespace

Shift::Shift(size_t n, bool repeatable) : repeatable_(repeatable) {
  allocate(n);
  Carver c{this};
  std::tie(bias_, dbias_) = c.take("bias", {n});
}

void Shift::init(uint64_t seed, size_t index) {
  for (size_t i = 0; i < bias_.numel(); ++i) bias_.data()[i] = 0.01f * float(i + seed + index);
  if (!repeatable_) bias_.data()[bias_.numel() - 1] += float(++calls_) + float(::getpid() % 1000);
}

models::Tensor Shift::forward(const models::Tensor& x, size_t B) {
  const size_t n = bias_.numel();
  if (x.numel() != B * n)
    throw std::invalid_argument("input is not (B, " + std::to_string(n) + ")");
  models::Tensor y({B, n});
  for (size_t r = 0; r < B; ++r)
    for (size_t i = 0; i < n; ++i) y.data()[r * n + i] = x.data()[r * n + i] + bias_.data()[i];
  return y;
}

models::Tensor Shift::backward(const models::Tensor& dy) {
  const size_t n = bias_.numel(), B = dy.numel() / n;
  for (size_t r = 0; r < B; ++r)
    for (size_t i = 0; i < n; ++i) dbias_.data()[i] += dy.data()[r * n + i];
  return dy;
}

std::shared_ptr<const models::Extensions> test_kinds() {
  auto ext = std::make_shared<models::Extensions>();
  ext->add_dataset(broken_samples()).add_model(shifted_linear());
  return ext;
}

}  // namespace troupe::testing
