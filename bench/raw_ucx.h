// The raw-UCX baseline of the control-plane benchmark: active messages between two processes
// with nothing on top (no actors, no Cap'n Proto, no queues), on the same transport settings
// as Troupe's (peer error handling, shared memory allowed). Both sides busy-poll.
#pragma once

#include <string>
#include <vector>

namespace troupe::bench {

struct RawUcxResult {
  std::vector<double> rtt_us;
  double messages_per_s = 0;
  std::string transports;  // the UCX transports the endpoint's lanes use
};

// Connects to a raw-ucx-server at address and measures.
RawUcxResult raw_ucx_client(const std::string& address, int round_trips, int messages,
                            int payload_bytes);

}  // namespace troupe::bench
