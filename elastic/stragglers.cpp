#include "elastic/stragglers.h"

#include <algorithm>
#include <cmath>

namespace troupe::elastic {
namespace {

bool reported(double s) { return std::isfinite(s) && s >= 0; }

// The median of the reported times other than rank r's (0 when there are none).
double median_of_others(const std::vector<double>& seconds, size_t r) {
  std::vector<double> others;
  for (size_t i = 0; i < seconds.size(); ++i)
    if (i != r && reported(seconds[i])) others.push_back(seconds[i]);
  if (others.empty()) return 0;
  const size_t mid = others.size() / 2;
  std::nth_element(others.begin(), others.begin() + long(mid), others.end());
  double m = others[mid];
  if (others.size() % 2 == 0)
    m = (m + *std::max_element(others.begin(), others.begin() + long(mid))) / 2;
  return m;
}

}  // namespace

std::vector<Straggler> StragglerDetector::observe(const std::vector<double>& seconds) {
  slow_.resize(seconds.size(), 0);
  std::vector<Straggler> out;
  for (size_t r = 0; r < seconds.size(); ++r) {
    const double median = median_of_others(seconds, r);
    const bool slow = reported(seconds[r]) && median > 0 && seconds[r] > policy_.factor * median &&
                      seconds[r] - median >= policy_.min_excess_seconds;
    if (!slow) {
      slow_[r] = 0;
      continue;
    }
    if (++slow_[r] == policy_.steps) out.push_back({uint32_t(r), seconds[r], median, slow_[r]});
  }
  return out;
}

}  // namespace troupe::elastic
