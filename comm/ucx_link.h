// The UCX data plane of one generation, below the algorithms (internal to comm/): the UCX worker,
// an endpoint to every member, the tagged requests and the one way to wait for them, the
// give-up policy (abort, a failure notice, a lost member, a gone process, the deadline) and the
// failure itself. A communicator and all its groups share one Link.
//
//   Endpoints  RAII: one endpoint per member, closed together (bounded) when it goes
//   drain      progress until requests complete or a deadline, then release them
//   Link       isend / irecv / wait; fail() breaks it for every user; notices tell the others
//
// Tag (64 bits, matched whole): generation (8) | context (6) | kind (2) | sequence or user tag
// (16) | source rank in the group (12) | slot (20). Each generation has its own UCX worker (a new
// address), so the generation bits only guard against the impossible; the context tells a
// communicator's groups apart (the whole communicator is context 0). Messages with equal tags
// from one sender match in order (UCX tag matching is ordered per endpoint), so sequences wrap.
//
// Thread-safety: one thread drives it; abort() (the atomic) from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/error.h"
#include "comm/ucx.h"
#include "comm/ucx_communicator.h"

namespace troupe::comm::ucx {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kCollective = 0, kPointToPoint = 1, kNotice = 2;
constexpr uint32_t kMaxContexts = 64;
// How long a failing member waits for its closes and cancelled requests to finish before it
// releases them to UCX (which frees them when they complete): short, it is on the recovery path.
constexpr std::chrono::milliseconds kDrainTime{20};

uint64_t make_tag(uint64_t gen, uint64_t context, uint64_t kind, uint64_t seq, uint64_t src,
                  uint64_t slot);

// A request of this process: null handle = completed at once.
struct Request {
  void* handle = nullptr;
  bool is_recv = false;
  size_t bytes = 0;  // a receive's: what the caller expects (a message of another size fails)
};

// Progresses the worker until every handle completes or the deadline passes, then releases them
// all (UCX frees one still in flight when it completes). Returns whether all completed.
bool drain(ucp_worker_h worker, std::vector<void*> handles, Clock::time_point deadline);

// An endpoint to every member (one owner, closed together).
class Endpoints {
 public:
  explicit Endpoints(ucp_worker_h worker) : worker_(worker) {}
  ~Endpoints() { close(); }
  Endpoints(const Endpoints&) = delete;
  Endpoints& operator=(const Endpoints&) = delete;

  // Creates the endpoint to `rank` (peer error handling, errors to handler(arg)). Throws.
  void open(int rank, const std::vector<uint8_t>& address, ucp_err_handler_cb_t handler, void* arg);
  void resize(size_t n) { eps_.assign(n, nullptr); }
  ucp_ep_h operator[](int rank) const { return eps_[size_t(rank)]; }
  size_t size() const { return eps_.size(); }
  // Force-closes every endpoint, waiting kDrainTime at most (a peer that is dead or stopped
  // may never answer); outstanding sends complete with an error.
  void close();

 private:
  ucp_worker_h worker_;
  std::vector<ucp_ep_h> eps_;
};

class Link {
 public:
  Link(uint64_t generation, const UcxCommOptions& options);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  ucp_worker_h worker() const { return worker_.get(); }
  uint64_t generation() const { return gen_; }
  const UcxCommOptions& options() const { return opt_; }
  int rank() const { return rank_; }
  int size() const { return int(eps_.size()); }

  // Endpoints to every member (rank -> UCX worker address); pids of co-located members (0 for
  // the others) let a wait notice a gone process sooner than UCX's keepalive.
  void connect(int rank, const std::vector<std::vector<uint8_t>>& addresses,
               std::vector<int> local_pids);

  Request isend(int rank, const void* buf, size_t bytes, uint64_t tag);
  Request irecv(void* buf, size_t bytes, uint64_t tag);
  // Waits until reqs[from, to) complete (the others stay outstanding); throws Error, after
  // which the link is broken (fail()).
  void wait(std::vector<Request>& reqs, size_t from, size_t to, std::chrono::milliseconds idle);
  void wait_all(std::vector<Request>& reqs, std::chrono::milliseconds idle) {
    wait(reqs, 0, reqs.size(), idle);
  }

  // Throws the link's error if it is broken or aborted.
  void check_usable();
  std::string size_mismatch(const ucp_tag_recv_info_t& info, size_t expected, ucs_status_t st);
  void abort() { aborted_.store(true); }

  // Breaks the link: cancels outstanding receives, tells the other members why (a notice),
  // closes every endpoint (outstanding sends complete), drains, then throws. Nothing can touch
  // a caller's buffers afterwards.
  [[noreturn]] void fail(Errc code, const std::string& why, std::vector<Request> outstanding,
                         bool tell_others = true);
  // Rethrows the current failure after draining reqs (fail() closed the endpoints).
  [[noreturn]] void fail_pending(std::vector<Request>& reqs);

  // Waiting on shared-memory counters (ShmAllreduce): the same ways out as wait(), checked every
  // few hundred spins (abort at every call); yields the core when members share cores.
  void shm_idle(uint64_t spins, std::chrono::milliseconds idle);
  void set_oversubscribed(bool v) { oversubscribed_ = v; }

  // While a call is under way, what it can tell of members that called it differently (e.g.
  // ShmAllreduce::split): asked when a wait has made no progress for kDrainTime; a text ends the
  // wait with invalid_input (it would end in timed_out). Cleared after the call.
  struct StallCheck {
    std::string (*check)(const void* of) = nullptr;
    const void* of = nullptr;
  };
  StallCheck stall_check;

  // Group contexts: the next free one (every member of the parent agrees on it, split()).
  uint32_t next_context = 1;

 private:
  struct EpArg {
    Link* link;
    int rank;
  };
  struct Notice {
    uint32_t code;
    int32_t origin;
  };
  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status);
  void post_notice_recv();
  bool notice_arrived();
  void send_notices(Errc code);
  [[noreturn]] void fail_from_notice(std::vector<Request>& reqs);
  void give_up_if_failed(std::vector<Request>& reqs);
  void give_up_if_idle(Clock::time_point& last_progress, std::chrono::milliseconds idle,
                       std::vector<Request>& reqs);

  uint64_t gen_;
  UcxCommOptions opt_;
  UcxContext ctx_;
  UcxWorker worker_;
  Endpoints eps_;  // (after the worker: closed before it goes)
  std::vector<std::unique_ptr<EpArg>> ep_args_;
  int rank_ = 0;
  std::vector<int> local_pids_;  // by rank; 0 if remote or this process
  Clock::time_point last_liveness_check_{};
  std::atomic<bool> aborted_{false};
  std::atomic<int> lost_rank_{-1};
  std::string lost_reason_;
  std::optional<Error> broken_;
  bool oversubscribed_ = false;
  Clock::time_point shm_wait_start_{};
  Clock::time_point idle_checked_{};  // a wait's last check (give_up_if_idle)
  // A failure notice from another member: the first member that fails tells the others why, so
  // a stopped member shows up as timed_out everywhere, not as the teardown that follows.
  Notice notice_in_{}, notice_out_{};
  void* notice_req_ = nullptr;
};

}  // namespace troupe::comm::ucx
