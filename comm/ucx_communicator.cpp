#include "comm/ucx_communicator.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "comm/buffer.h"
#include "comm/hex.h"
#include "comm/reduce.h"
#include "comm/shm_allreduce.h"
#include "comm/ucx.h"

namespace troupe::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Tag: generation (12) | kind (2) | sequence or user tag (18) | source rank (12) | slot (20).
// Receives match all 64 bits. Each generation also has its own UCX worker (a new address), so
// an older generation's member cannot even reach this one. Messages with equal tags from one
// sender match in order (UCX tag matching is ordered per endpoint), so sequences may wrap.
constexpr uint64_t kCollective = 0, kPointToPoint = 1, kNotice = 2;
// How long a failing member waits for its closes and cancelled requests to finish before it
// releases them to UCX (which frees them when they complete): short, it is on the recovery path.
constexpr int kDrainMs = 20;
constexpr uint64_t kAnySourceMask = ~(uint64_t(0xFFF) << 20);

uint64_t make_tag(uint64_t gen, uint64_t kind, uint64_t seq, uint64_t src, uint64_t slot) {
  return (gen & 0xFFF) << 52 | (kind & 0x3) << 50 | (seq & 0x3FFFF) << 32 | (src & 0xFFF) << 20 |
         (slot & 0xFFFFF);
}

// This host as the members see it: the name, the boot, and the pid namespace (containers that
// share a host name, or processes of another namespace, are not "local": their pids differ).
std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat st {};
  unsigned long long pidns = stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
  std::string id = std::string(buf) + "/" + boot + "/" + std::to_string(pidns);
  std::replace(id.begin(), id.end(), '@', '_');
  return id;
}

// Whether a process on this host is gone (exited, or a zombie waiting to be reaped).
bool process_gone(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return true;
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace

struct UcxCommunicator::Impl {
  struct EpArg {
    Impl* impl;
    int rank;
  };
  struct Req {
    void* handle = nullptr;  // null: completed at once
    bool is_recv = false;
  };

  uint64_t gen;
  UcxCommOptions opt;
  UcxContext ctx;
  UcxWorker worker;
  int my_rank = 0, n = 1;
  std::vector<ucp_ep_h> eps;
  std::vector<std::unique_ptr<EpArg>> ep_args;
  // Members on this host, by pid: over shared memory UCX learns of a dead peer only through
  // keepalive (slow), so an idle wait also checks whether those processes still exist.
  std::vector<int> local_pids;  // by rank; 0 if remote or this process
  Clock::time_point last_liveness_check{};
  std::atomic<bool> aborted{false};
  std::atomic<int> lost_rank{-1};
  std::string lost_reason;
  std::optional<Error> broken;
  uint32_t seq = 0;
  Buffer scratch;
  std::unique_ptr<ShmAllreduce> shm;  // set when every member is on this host
  std::string shm_why_not;
  bool oversubscribed = false;  // more members on this host than cores
  // A failure notice from another member: the first member that fails tells the others why, so
  // a stopped member shows up as timed_out everywhere, not as the teardown that follows.
  struct Notice {
    uint32_t code;
    int32_t origin;
  } notice_in{}, notice_out{};
  void* notice_req = nullptr;

  Impl(uint64_t g, const UcxCommOptions& o)
      : gen(g), opt(o), ctx(context_options(o)), worker(ctx, false) {}

  static UcxContextOptions context_options(const UcxCommOptions& o) {
    UcxContextOptions c;
    c.shared_memory = o.shared_memory;
    c.tag = true;
    // A dead member must surface as peer_lost well within the failure timeout.
    auto ka = std::max<int64_t>(20, o.timeout.count() / 10);
    c.keepalive_interval = std::to_string(ka) + "ms";
    return c;
  }

  ~Impl() {
    if (notice_req) {
      ucp_request_cancel(worker.get(), notice_req);
      auto deadline = Clock::now() + std::chrono::milliseconds(kDrainMs);
      while (ucp_request_check_status(notice_req) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker.get());
      ucp_request_free(notice_req);
    }
    close_endpoints();
  }

  void post_notice_recv() {
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker.get(), &notice_in, sizeof notice_in,
                                          make_tag(gen, kNotice, 0, 0, 0), kAnySourceMask, &p);
    notice_req = UCS_PTR_IS_ERR(r) ? nullptr : r;
  }

  // A notice that arrived, if any.
  bool notice_arrived() {
    if (!notice_req) return false;
    if (ucp_request_check_status(notice_req) == UCS_INPROGRESS) return false;
    ucp_request_free(notice_req);
    notice_req = nullptr;
    return true;
  }

  // Tells every other member why this one gives up (best effort, bounded).
  void send_notices(Errc code) {
    notice_out = Notice{uint32_t(code), my_rank};
    std::vector<void*> sent;
    for (int r = 0; r < int(eps.size()); ++r) {
      if (r == my_rank || !eps[r] || r == lost_rank.load()) continue;
      ucp_request_param_t p{};
      ucs_status_ptr_t q = ucp_tag_send_nbx(eps[r], &notice_out, sizeof notice_out,
                                            make_tag(gen, kNotice, 0, my_rank, 0), &p);
      if (q && !UCS_PTR_IS_ERR(q)) sent.push_back(q);
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(kDrainMs);
    for (void* q : sent) {
      while (ucp_request_check_status(q) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker.get());
      if (ucp_request_check_status(q) == UCS_INPROGRESS) ucp_request_cancel(worker.get(), q);
    }
    for (void* q : sent) {
      auto until = Clock::now() + std::chrono::milliseconds(kDrainMs);
      while (ucp_request_check_status(q) == UCS_INPROGRESS && Clock::now() < until)
        ucp_worker_progress(worker.get());
      ucp_request_free(q);
    }
  }

  [[noreturn]] void fail_from_notice(std::vector<Req>& reqs) {
    Errc code = Errc(notice_in.code);
    if (code != Errc::peer_lost && code != Errc::timed_out && code != Errc::aborted &&
        code != Errc::invalid_input)
      code = Errc::peer_lost;
    fail(code,
         std::string(errc_name(code)) + " reported by rank " + std::to_string(notice_in.origin) +
             ", which gave up first",
         reqs, /*tell_others=*/false);
  }

  void close_endpoints() {
    std::vector<void*> closing;
    for (auto& ep : eps) {
      if (!ep) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
      if (r && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
      ep = nullptr;
    }
    // Bounded: an endpoint to a dead or stopped peer may never finish closing; a request still
    // in flight is released by UCX when it completes.
    auto deadline = Clock::now() + std::chrono::milliseconds(kDrainMs);
    for (void* r : closing) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker.get());
      ucp_request_free(r);
    }
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* a = static_cast<EpArg*>(arg);
    int expected = -1;
    if (a->impl->lost_rank.compare_exchange_strong(expected, a->rank)) {
      a->impl->lost_reason = ucs_status_string(status);
    }
  }

  void check_usable() {
    if (broken) throw *broken;
    if (aborted.load()) fail(Errc::aborted, "the communicator was aborted", {});
  }

  std::chrono::milliseconds timeout(const CollectiveOptions& o) const {
    return o.timeout.count() > 0 ? o.timeout : opt.timeout;
  }

  Req isend(int peer, const void* buf, size_t bytes, uint64_t tag) {
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_tag_send_nbx(eps[peer], buf, bytes, tag, &p);
    if (UCS_PTR_IS_ERR(r)) {
      fail(Errc::peer_lost,
           "send to rank " + std::to_string(peer) +
               " failed: " + ucs_status_string(UCS_PTR_STATUS(r)),
           {});
    }
    return Req{r, false};
  }

  Req irecv(void* buf, size_t bytes, uint64_t tag) {
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker.get(), buf, bytes, tag, ~uint64_t(0), &p);
    if (UCS_PTR_IS_ERR(r))
      fail(Errc::io, std::string("receive failed: ") + ucs_status_string(UCS_PTR_STATUS(r)), {});
    return Req{r, true};
  }

  // Waits until every request in reqs[from, to) completes; the others stay outstanding.
  void wait(std::vector<Req>& reqs, size_t from, size_t to,
            std::chrono::milliseconds idle_timeout) {
    auto last_progress = Clock::now();
    unsigned idle = 0;
    while (true) {
      bool all = true;
      for (size_t i = from; i < to; ++i) {
        Req& r = reqs[i];
        if (!r.handle) continue;
        ucs_status_t st = ucp_request_check_status(r.handle);
        if (st == UCS_INPROGRESS) {
          all = false;
          continue;
        }
        ucp_request_free(r.handle);
        r.handle = nullptr;
        last_progress = Clock::now();
        if (st != UCS_OK) {
          int lost = lost_rank.load();
          fail(Errc::peer_lost,
               lost >= 0 ? "rank " + std::to_string(lost) + " lost: " + lost_reason
                         : std::string("transfer failed: ") + ucs_status_string(st),
               reqs);
        }
      }
      if (all) return;
      give_up_if_failed(reqs);
      if (ucp_worker_progress(worker.get()) != 0) {
        idle = 0;
        continue;
      }
      if (++idle % 64 == 0) {
        give_up_if_idle(last_progress, idle_timeout, reqs);
        sched_yield();  // several ranks may share a core
      }
    }
  }

  // The ways out of a wait: abort, another member's failure notice, a lost member. Throws.
  void give_up_if_failed(std::vector<Req>& reqs) {
    if (aborted.load()) fail(Errc::aborted, "the communicator was aborted", reqs);
    if (notice_arrived()) fail_from_notice(reqs);
    int lost = lost_rank.load();
    if (lost >= 0) {
      // A member that gave up closes its endpoints right after its notice: give the notice a
      // moment to arrive, so that the cause, not the teardown, is reported.
      auto until = Clock::now() + std::chrono::milliseconds(20);
      while (Clock::now() < until) {
        ucp_worker_progress(worker.get());
        if (notice_arrived()) fail_from_notice(reqs);
      }
      fail(Errc::peer_lost, "rank " + std::to_string(lost) + " lost: " + lost_reason, reqs);
    }
  }

  // After no progress since last_progress: a co-located member whose process is gone becomes
  // the lost member (give_up_if_failed reports it); past idle_timeout, timed_out. Throws.
  void give_up_if_idle(Clock::time_point last_progress, std::chrono::milliseconds idle_timeout,
                       std::vector<Req>& reqs) {
    auto now = Clock::now();
    if (now - last_progress > std::chrono::milliseconds(20) &&
        now - last_liveness_check > std::chrono::milliseconds(20)) {
      last_liveness_check = now;
      for (int r = 0; r < int(local_pids.size()); ++r) {
        if (local_pids[r] > 0 && process_gone(local_pids[r])) {
          int expected = -1;
          if (lost_rank.compare_exchange_strong(expected, r))
            lost_reason = "process " + std::to_string(local_pids[r]) + " is gone";
        }
      }
    }
    if (now - last_progress > idle_timeout) {
      fail(Errc::timed_out,
           "no progress for " + std::to_string(idle_timeout.count()) +
               " ms (a member is stopped, hung or unreachable)",
           reqs);
    }
  }

  // Waiting on shared-memory counters (ShmAllreduce): the same ways out as wait(), checked
  // every few hundred spins (abort at every call); the core is yielded, ranks may share one.
  Clock::time_point shm_wait_start{};
  void shm_idle(uint64_t spins, std::chrono::milliseconds idle_timeout) {
    std::vector<Req> none;
    if (aborted.load()) fail(Errc::aborted, "the communicator was aborted", none);
    if (spins <= 32) shm_wait_start = Clock::now();
    if (spins % 256 == 0) {
      ucp_worker_progress(worker.get());
      give_up_if_idle(shm_wait_start, idle_timeout, none);
      give_up_if_failed(none);
    }
    // Spin a little first when every rank has a core of its own (a wait between ranks in step
    // is a few microseconds; a yield is a system call), yield at once when they share cores.
    if (oversubscribed || spins > 1024) sched_yield();
  }

  // Sets up the shared-memory allreduce when every member is on this host. Every member comes
  // to the same decision: an allgather of what each asks for and of its segment, then an
  // agreement that every member mapped every segment. Otherwise everyone keeps the ring, and
  // shm_why_not says why.
  void setup_shm(const std::vector<int>& pids, bool all_local, std::chrono::milliseconds to) {
    if (!all_local || n < 2 || n > 64) {
      shm_why_not = n < 2        ? "one member"
                    : !all_local ? "not every member is on this host"
                                 : "more than 64 members";
      return;
    }
    // What this rank asks for and offers: shared memory on, slice, switch size, fd, identity.
    constexpr int kFields = 5;
    std::unique_ptr<ShmAllreduce> mine;
    std::vector<int64_t> all(size_t(n) * kFields, 0);
    int64_t* me = &all[size_t(my_rank) * kFields];
    me[0] = opt.shared_memory;
    me[1] = int64_t(ShmAllreduce::slice_for(n, opt.shm_slice_bytes));
    me[2] = int64_t(opt.shm_min_bytes);
    me[3] = -1;
    if (opt.shared_memory) {
      std::random_device rd;
      uint64_t identity = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
      mine = std::make_unique<ShmAllreduce>(my_rank, n, opt.shm_slice_bytes, identity);
      me[3] = mine->fd();
      me[4] = int64_t(identity);
    }
    Segments sg;
    for (int i = 0; i < n; ++i) {
      sg.offset.push_back(size_t(i) * kFields);
      sg.count.push_back(kFields);
    }
    ring_allgather(reinterpret_cast<uint8_t*>(all.data()), sg, sizeof(int64_t), 0, ++seq, 0, to);
    std::string why;
    std::vector<int> fds(static_cast<size_t>(n));
    std::vector<uint64_t> identities(static_cast<size_t>(n));
    for (int r = 0; r < n && why.empty(); ++r) {
      const int64_t* f = &all[size_t(r) * kFields];
      if (!f[0])
        why = "rank " + std::to_string(r) + " has shared memory off";
      else if (f[1] != all[1] || f[2] != all[2])  // (rank 0's: the same reason everywhere)
        why = "rank " + std::to_string(r) + "'s shared-memory options differ from rank 0's";
      fds[size_t(r)] = int(f[3]);
      identities[size_t(r)] = uint64_t(f[4]);
    }
    // Every rank reaches the same answer so far; attaching may fail on some.
    std::string attach_why = why.empty() ? mine->attach(pids, fds, identities) : "";
    double failures = attach_why.empty() ? 0 : 1;
    allreduce_rd(reinterpret_cast<uint8_t*>(&failures), 1, DataType::f64, ++seq, to);
    if (why.empty() && failures == 0) {
      shm = std::move(mine);
    } else {
      shm_why_not = !why.empty()          ? why
                    : !attach_why.empty() ? attach_why
                                          : std::to_string(int(failures)) +
                                                " other member(s) could not map the segments";
    }
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus)
                                                              : int(sysconf(_SC_NPROCESSORS_ONLN));
    oversubscribed = cores > 0 && n > cores;
  }

  void wait_all(std::vector<Req>& reqs, std::chrono::milliseconds t) {
    wait(reqs, 0, reqs.size(), t);
  }

  // Breaks the communicator: cancel outstanding receives, close every endpoint (which completes
  // outstanding sends), drain, then throw. Nothing can touch the caller's buffers afterwards.
  [[noreturn]] void fail(Errc code, const std::string& why, std::vector<Req> outstanding,
                         bool tell_others = true) {
    for (auto& r : outstanding)
      if (r.handle && r.is_recv) ucp_request_cancel(worker.get(), r.handle);
    if (tell_others) send_notices(code);
    close_endpoints();
    auto deadline = Clock::now() + std::chrono::milliseconds(kDrainMs);
    for (auto& r : outstanding) {
      if (!r.handle) continue;
      while (ucp_request_check_status(r.handle) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker.get());
      ucp_request_free(r.handle);
      r.handle = nullptr;
    }
    broken = Error(code, why + " (generation " + std::to_string(gen) + ", rank " +
                             std::to_string(my_rank) + ")");
    throw *broken;
  }

  uint8_t* scratch_of(size_t bytes) {
    if (scratch.size() < bytes) scratch = Buffer(bytes);
    return scratch.data();
  }

  // ---- algorithms ----------------------------------------------------------------------

  void allreduce_rd(uint8_t* buf, size_t count, DataType t, uint64_t s,
                    std::chrono::milliseconds to) {
    const size_t bytes = count * element_size(t);
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    const int extra = n - p2;
    uint8_t* tmp = scratch_of(bytes);
    std::vector<Req> reqs;
    if (my_rank >= p2) {  // fold into rank - p2, get the result back
      int partner = my_rank - p2;
      reqs.push_back(isend(partner, buf, bytes, make_tag(gen, kCollective, s, my_rank, 0)));
      reqs.push_back(irecv(buf, bytes, make_tag(gen, kCollective, s, partner, 1)));
      wait_all(reqs, to);
      return;
    }
    if (my_rank < extra) {
      reqs.push_back(irecv(tmp, bytes, make_tag(gen, kCollective, s, my_rank + p2, 0)));
      wait_all(reqs, to);
      reqs.clear();
      reduce_sum(buf, tmp, count, t);
    }
    uint64_t round = 2;
    for (int mask = 1; mask < p2; mask <<= 1, ++round) {
      int partner = my_rank ^ mask;
      reqs.push_back(irecv(tmp, bytes, make_tag(gen, kCollective, s, partner, round)));
      reqs.push_back(isend(partner, buf, bytes, make_tag(gen, kCollective, s, my_rank, round)));
      wait_all(reqs, to);
      reqs.clear();
      // Lower rank's data first on both sides: the same sum, bitwise, everywhere.
      if (partner < my_rank) {
        reduce_sum(tmp, buf, count, t);
        std::memcpy(buf, tmp, bytes);
      } else {
        reduce_sum(buf, tmp, count, t);
      }
    }
    if (my_rank < extra) {
      reqs.push_back(isend(my_rank + p2, buf, bytes, make_tag(gen, kCollective, s, my_rank, 1)));
      wait_all(reqs, to);
    }
  }

  struct Segments {
    std::vector<size_t> offset, count;  // in elements
  };
  Segments split(size_t count) const {
    Segments sg;
    size_t base = count / n, rem = count % n, at = 0;
    for (int i = 0; i < n; ++i) {
      size_t c = base + (size_t(i) < rem ? 1 : 0);
      sg.offset.push_back(at);
      sg.count.push_back(c);
      at += c;
    }
    return sg;
  }

  int mod(int x) const { return ((x % n) + n) % n; }

  // Ring reduce-scatter over buf's n segments. At step k rank r sends segment (r-k+off) and
  // reduces the received segment (r-k-1+off); at the end it owns segment (r+1+off) reduced.
  void ring_reduce_scatter(uint8_t* buf, const Segments& sg, DataType t, int off, uint64_t s,
                           std::chrono::milliseconds to) {
    const size_t es = element_size(t);
    const size_t chunk = std::max<size_t>(1, opt.segment_bytes / es);
    const size_t window = std::max<size_t>(1, opt.window);
    const int next = mod(my_rank + 1), prev = mod(my_rank - 1);
    size_t max_seg = *std::max_element(sg.count.begin(), sg.count.end());
    uint8_t* tmp = scratch_of(std::min(max_seg, chunk * window) * es);
    for (int step = 0; step < n - 1; ++step) {
      int send_seg = mod(my_rank - step + off), recv_seg = mod(my_rank - step - 1 + off);
      size_t send_chunks = (sg.count[send_seg] + chunk - 1) / chunk;
      size_t recv_chunks = (sg.count[recv_seg] + chunk - 1) / chunk;
      std::vector<Req> sends, recvs(recv_chunks);
      for (size_t c = 0; c < send_chunks; ++c) {
        size_t at = c * chunk, len = std::min(chunk, sg.count[send_seg] - at);
        sends.push_back(isend(next, buf + (sg.offset[send_seg] + at) * es, len * es,
                              make_tag(gen, kCollective, s, my_rank, (uint64_t(step) << 12) + c)));
      }
      auto post = [&](size_t c) {
        size_t at = c * chunk, len = std::min(chunk, sg.count[recv_seg] - at);
        recvs[c] = irecv(tmp + (c % window) * chunk * es, len * es,
                         make_tag(gen, kCollective, s, prev, (uint64_t(step) << 12) + c));
      };
      for (size_t c = 0; c < std::min(window, recv_chunks); ++c) post(c);
      for (size_t c = 0; c < recv_chunks; ++c) {
        try {
          wait(recvs, c, c + 1, to);
        } catch (...) {
          fail_pending(sends);
        }
        size_t at = c * chunk, len = std::min(chunk, sg.count[recv_seg] - at);
        reduce_sum(buf + (sg.offset[recv_seg] + at) * es, tmp + (c % window) * chunk * es, len, t);
        if (c + window < recv_chunks) post(c + window);
      }
      wait_all(sends, to);
    }
  }

  // Ring allgather of segments: at step k rank r sends segment (r-k+off), receives (r-k-1+off).
  void ring_allgather(uint8_t* buf, const Segments& sg, size_t es, int off, uint64_t s,
                      uint64_t phase, std::chrono::milliseconds to) {
    const int next = mod(my_rank + 1), prev = mod(my_rank - 1);
    const size_t chunk = std::max<size_t>(1, opt.segment_bytes / es);
    for (int step = 0; step < n - 1; ++step) {
      int send_seg = mod(my_rank - step + off), recv_seg = mod(my_rank - step - 1 + off);
      std::vector<Req> reqs;
      for (size_t at = 0, c = 0; at < sg.count[recv_seg]; at += chunk, ++c) {
        size_t len = std::min(chunk, sg.count[recv_seg] - at);
        reqs.push_back(
            irecv(buf + (sg.offset[recv_seg] + at) * es, len * es,
                  make_tag(gen, kCollective, s, prev, phase + (uint64_t(step) << 12) + c)));
      }
      for (size_t at = 0, c = 0; at < sg.count[send_seg]; at += chunk, ++c) {
        size_t len = std::min(chunk, sg.count[send_seg] - at);
        reqs.push_back(
            isend(next, buf + (sg.offset[send_seg] + at) * es, len * es,
                  make_tag(gen, kCollective, s, my_rank, phase + (uint64_t(step) << 12) + c)));
      }
      wait_all(reqs, to);
    }
  }

  // Rethrows the current failure after draining the given requests (fail() already broke the
  // communicator and closed the endpoints, so they complete).
  [[noreturn]] void fail_pending(std::vector<Req>& reqs) {
    auto deadline = Clock::now() + std::chrono::milliseconds(kDrainMs);
    for (auto& r : reqs) {
      if (!r.handle) continue;
      while (ucp_request_check_status(r.handle) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker.get());
      ucp_request_free(r.handle);
      r.handle = nullptr;
    }
    throw;
  }
};

UcxCommunicator::UcxCommunicator(uint64_t generation, const UcxCommOptions& options)
    : impl_(std::make_unique<Impl>(generation, options)) {}

UcxCommunicator::~UcxCommunicator() = default;

std::string UcxCommunicator::address() const {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  TROUPE_UCS_CHECK(ucp_worker_get_address(impl_->worker.get(), &addr, &len));
  std::string hex = to_hex(addr, len);
  ucp_worker_release_address(impl_->worker.get(), addr);
  return std::to_string(getpid()) + "@" + host_name() + "@" + hex;
}

void UcxCommunicator::connect(int rank, const std::vector<std::string>& addresses,
                              std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  if (addresses.empty() || rank < 0 || size_t(rank) >= addresses.size()) {
    TROUPE_FAIL(Errc::invalid_input, "rank " + std::to_string(rank) +
                                         " is not in a member list of " +
                                         std::to_string(addresses.size()));
  }
  if (addresses.size() > 4095) TROUPE_FAIL(Errc::invalid_input, "at most 4095 members");
  m.my_rank = rank;
  m.n = int(addresses.size());
  m.eps.assign(m.n, nullptr);
  const std::string me = host_name();
  m.local_pids.assign(m.n, 0);
  std::vector<int> pids(m.n, 0);
  bool all_local = true;
  for (int r = 0; r < m.n; ++r) {
    // "PID@HOST@HEX"
    auto a = addresses[r].find('@'), b = addresses[r].find('@', a == std::string::npos ? 0 : a + 1);
    if (a == std::string::npos || b == std::string::npos) {
      TROUPE_FAIL(Errc::invalid_input,
                  "member address " + std::to_string(r) + " is not PID@HOST@UCX-ADDRESS");
    }
    int pid = std::atoi(addresses[r].substr(0, a).c_str());
    bool local = addresses[r].substr(a + 1, b - a - 1) == me;
    if (local && pid != getpid()) m.local_pids[r] = pid;
    pids[r] = pid;
    all_local = all_local && local && pid > 0;
    auto bytes = from_hex(addresses[r].substr(b + 1));
    m.ep_args.push_back(std::make_unique<Impl::EpArg>(Impl::EpArg{&m, r}));
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(bytes.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::on_ep_error;
    p.err_handler.arg = m.ep_args.back().get();
    ucs_status_t st = ucp_ep_create(m.worker.get(), &p, &m.eps[r]);
    if (st != UCS_OK) {
      TROUPE_FAIL(Errc::peer_lost,
                  "cannot reach rank " + std::to_string(r) + ": " + ucs_status_string(st));
    }
  }
  m.post_notice_recv();
  CollectiveOptions o;
  o.timeout = timeout;
  barrier(o);
  m.setup_shm(pids, all_local, timeout);
}

bool UcxCommunicator::shared_memory_allreduce() const { return impl_->shm != nullptr; }
std::string UcxCommunicator::shared_memory_fallback_reason() const { return impl_->shm_why_not; }

int UcxCommunicator::rank() const { return impl_->my_rank; }
int UcxCommunicator::size() const { return impl_->n; }
uint64_t UcxCommunicator::generation() const { return impl_->gen; }

void UcxCommunicator::abort() { impl_->aborted.store(true); }

void UcxCommunicator::allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  const uint64_t s = ++m.seq;
  const size_t es = element_size(type), bytes = count * es;
  auto* buf = static_cast<uint8_t*>(out);
  auto to = m.timeout(options);
  Algorithm a = options.algorithm;
  if (a == Algorithm::automatic) {
    // Shared memory for the smallest calls (whole, through the headers) and from shm_min_bytes
    // up (chunked); recursive doubling over UCX between those.
    const bool shm_size = bytes <= ShmAllreduce::kSmallBytes || bytes >= m.opt.shm_min_bytes;
    a = m.shm && shm_size                                  ? Algorithm::shared_memory
        : bytes < m.opt.small_bytes || count < size_t(m.n) ? Algorithm::recursive_doubling
                                                           : Algorithm::ring;
  }
  if (a == Algorithm::shared_memory && !m.shm) a = Algorithm::ring;
  if (a == Algorithm::shared_memory && m.n > 1 && count > 0) {
    // Reads in, writes out: no copy up front.
    std::string mismatch =
        m.shm->run(static_cast<const uint8_t*>(in ? in : out), buf, count, type,
                   op == ReduceOp::avg, [&](uint64_t spins) { m.shm_idle(spins, to); });
    if (!mismatch.empty()) m.fail(Errc::invalid_input, "allreduce calls differ: " + mismatch, {});
    return;
  }
  if (in && in != out && bytes) std::memcpy(buf, in, bytes);
  if (m.n == 1 || count == 0) return;
  if (a == Algorithm::recursive_doubling) {
    m.allreduce_rd(buf, count, type, s, to);
  } else {
    auto sg = m.split(count);
    m.ring_reduce_scatter(buf, sg, type, 0, s, to);
    m.ring_allgather(buf, sg, es, 1, s, uint64_t(1) << 19, to);
  }
  if (op == ReduceOp::avg) scale_down(buf, count, type, m.n);
}

void UcxCommunicator::broadcast(void* buf, size_t count, DataType type, int root,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  if (root < 0 || root >= m.n)
    TROUPE_FAIL(Errc::invalid_input, "broadcast root " + std::to_string(root) + " is not a rank");
  const uint64_t s = ++m.seq;
  const size_t bytes = count * element_size(type);
  if (m.n == 1 || bytes == 0) return;
  auto to = m.timeout(options);
  const int vr = m.mod(m.my_rank - root);
  auto real = [&](int v) { return m.mod(v + root); };
  int mask = 1;
  std::vector<Impl::Req> reqs;
  while (mask < m.n) {
    if (vr & mask) {
      int parent = real(vr - mask);
      reqs.push_back(m.irecv(buf, bytes, make_tag(m.gen, kCollective, s, parent, 0)));
      m.wait_all(reqs, to);
      reqs.clear();
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  while (mask > 0) {
    if (vr + mask < m.n)
      reqs.push_back(
          m.isend(real(vr + mask), buf, bytes, make_tag(m.gen, kCollective, s, m.my_rank, 0)));
    mask >>= 1;
  }
  m.wait_all(reqs, to);
}

void UcxCommunicator::allgather(const void* in, void* out, size_t count, DataType type,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  const uint64_t s = ++m.seq;
  const size_t es = element_size(type);
  auto* buf = static_cast<uint8_t*>(out);
  if (in && in != buf + m.my_rank * count * es && count)
    std::memcpy(buf + m.my_rank * count * es, in, count * es);
  if (m.n == 1 || count == 0) return;
  Impl::Segments sg;
  for (int i = 0; i < m.n; ++i) {
    sg.offset.push_back(i * count);
    sg.count.push_back(count);
  }
  m.ring_allgather(buf, sg, es, 0, s, 0, m.timeout(options));
}

void UcxCommunicator::reduce_scatter(const void* in, void* out, size_t count, DataType type,
                                     ReduceOp op, const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  const uint64_t s = ++m.seq;
  const size_t es = element_size(type);
  if (m.n == 1 || count == 0) {
    if (count && in != out) std::memmove(out, in, count * es);
    if (op == ReduceOp::avg && count) scale_down(out, count, type, 1);
    return;
  }
  // Work on a copy: the caller's input stays as it was.
  Buffer work(count * m.n * es);
  std::memcpy(work.data(), in, count * m.n * es);
  Impl::Segments sg;
  for (int i = 0; i < m.n; ++i) {
    sg.offset.push_back(i * count);
    sg.count.push_back(count);
  }
  m.ring_reduce_scatter(work.data(), sg, type, -1, s, m.timeout(options));
  std::memcpy(out, work.data() + m.my_rank * count * es, count * es);
  if (op == ReduceOp::avg) scale_down(out, count, type, m.n);
}

void UcxCommunicator::send(const void* buf, size_t bytes, int peer, uint32_t tag,
                           const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  if (peer < 0 || peer >= m.n || peer == m.my_rank)
    TROUPE_FAIL(Errc::invalid_input, "send to rank " + std::to_string(peer));
  std::vector<Impl::Req> reqs{
      m.isend(peer, buf, bytes, make_tag(m.gen, kPointToPoint, tag, m.my_rank, 0))};
  m.wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::recv(void* buf, size_t bytes, int peer, uint32_t tag,
                           const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  if (peer < 0 || peer >= m.n || peer == m.my_rank)
    TROUPE_FAIL(Errc::invalid_input, "recv from rank " + std::to_string(peer));
  std::vector<Impl::Req> reqs{m.irecv(buf, bytes, make_tag(m.gen, kPointToPoint, tag, peer, 0))};
  m.wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::send_many(const std::vector<Span>& spans, int peer, uint32_t tag,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  if (peer < 0 || peer >= m.n || peer == m.my_rank)
    TROUPE_FAIL(Errc::invalid_input, "send to rank " + std::to_string(peer));
  std::vector<Impl::Req> reqs;
  for (const Span& s : spans)
    reqs.push_back(
        m.isend(peer, s.data, s.bytes, make_tag(m.gen, kPointToPoint, tag, m.my_rank, 0)));
  if (!reqs.empty()) m.wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::recv_many(const std::vector<Span>& spans, int peer, uint32_t tag,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  if (peer < 0 || peer >= m.n || peer == m.my_rank)
    TROUPE_FAIL(Errc::invalid_input, "recv from rank " + std::to_string(peer));
  std::vector<Impl::Req> reqs;
  for (const Span& s : spans)
    reqs.push_back(m.irecv(s.data, s.bytes, make_tag(m.gen, kPointToPoint, tag, peer, 0)));
  if (!reqs.empty()) m.wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::sendrecv(const void* send_buf, size_t send_bytes, int send_peer,
                               void* recv_buf, size_t recv_bytes, int recv_peer, uint32_t tag,
                               const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  for (int p : {send_peer, recv_peer})
    if (p != -1 && (p < 0 || p >= m.n || p == m.my_rank))
      TROUPE_FAIL(Errc::invalid_input, "sendrecv with rank " + std::to_string(p));
  std::vector<Impl::Req> reqs;
  if (recv_peer >= 0)
    reqs.push_back(
        m.irecv(recv_buf, recv_bytes, make_tag(m.gen, kPointToPoint, tag, recv_peer, 0)));
  if (send_peer >= 0)
    reqs.push_back(m.isend(send_peer, send_buf, send_bytes,
                           make_tag(m.gen, kPointToPoint, tag, m.my_rank, 0)));
  if (!reqs.empty()) m.wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::barrier(const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.check_usable();
  const uint64_t s = ++m.seq;
  if (m.n == 1) return;
  auto to = m.timeout(options);
  // Dissemination: log2(n) rounds of one-byte messages.
  uint8_t out_byte = 1, in_byte = 0;
  uint64_t round = 0;
  for (int dist = 1; dist < m.n; dist <<= 1, ++round) {
    std::vector<Impl::Req> reqs;
    reqs.push_back(
        m.irecv(&in_byte, 1, make_tag(m.gen, kCollective, s, m.mod(m.my_rank - dist), round)));
    reqs.push_back(m.isend(m.mod(m.my_rank + dist), &out_byte, 1,
                           make_tag(m.gen, kCollective, s, m.my_rank, round)));
    m.wait_all(reqs, to);
  }
}

}  // namespace troupe::comm
