#include "comm/communicator.h"

#include <algorithm>

namespace troupe::comm {

uint32_t Tag::too_large(uint32_t value) {
  TROUPE_FAIL(Errc::invalid_input, "tag " + std::to_string(value) + " does not fit in " +
                                       std::to_string(kBits) + " bits");
}

std::unique_ptr<Communicator> Communicator::group(const std::vector<int>& ranks,
                                                  const CollectiveOptions& options) {
  auto at = std::find(ranks.begin(), ranks.end(), rank());
  const int key = int(at - ranks.begin());
  return split(at == ranks.end() ? -1 : 0, key, options);
}

}  // namespace troupe::comm
