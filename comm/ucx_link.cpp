#include "comm/ucx_link.h"

#include <sched.h>

#include "comm/host_identity.h"

namespace troupe::comm::ucx {
namespace {

constexpr uint64_t kAnySourceMask = ~(uint64_t(0xFFF) << 20);

UcxContextOptions context_options(const UcxCommOptions& o) {
  UcxContextOptions c;
  c.shared_memory = o.shared_memory;
  c.tag = true;
  // A dead member must surface as peer_lost well within the failure timeout.
  auto ka = std::max<int64_t>(20, o.timeout.count() / 10);
  c.keepalive_interval = std::to_string(ka) + "ms";
  return c;
}

bool in_progress(void* handle) { return ucp_request_check_status(handle) == UCS_INPROGRESS; }

}  // namespace

uint64_t make_tag(uint64_t gen, uint64_t context, uint64_t kind, uint64_t seq, uint64_t src,
                  uint64_t slot) {
  return (gen & 0xFF) << 56 | (context & 0x3F) << 50 | (kind & 0x3) << 48 | (seq & 0xFFFF) << 32 |
         (src & 0xFFF) << 20 | (slot & 0xFFFFF);
}

bool drain(ucp_worker_h worker, std::vector<void*> handles, Clock::time_point deadline) {
  bool all = true;
  for (void* h : handles) {
    if (!h) continue;
    while (in_progress(h) && Clock::now() < deadline) ucp_worker_progress(worker);
    all = all && !in_progress(h);
    ucp_request_free(h);
  }
  return all;
}

void Endpoints::open(int rank, const std::vector<uint8_t>& address, ucp_err_handler_cb_t handler,
                     void* arg) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = handler;
  p.err_handler.arg = arg;
  ucs_status_t st = ucp_ep_create(worker_, &p, &eps_.at(size_t(rank)));
  if (st != UCS_OK)
    TROUPE_FAIL(Errc::peer_lost,
                "cannot reach rank " + std::to_string(rank) + ": " + ucs_status_string(st));
}

void Endpoints::close() {
  std::vector<void*> closing;
  for (auto& ep : eps_) {
    if (!ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
    ep = nullptr;
  }
  drain(worker_, std::move(closing), Clock::now() + kDrainTime);
}

Link::Link(uint64_t generation, const UcxCommOptions& options)
    : gen_(generation),
      opt_(options),
      ctx_(context_options(options)),
      worker_(ctx_, false),
      eps_(worker_.get()) {}

Link::~Link() {
  if (notice_req_) {
    ucp_request_cancel(worker_.get(), notice_req_);
    drain(worker_.get(), {notice_req_}, Clock::now() + kDrainTime);
  }
  eps_.close();
}

void Link::connect(int rank, const std::vector<std::vector<uint8_t>>& addresses,
                   std::vector<int> local_pids) {
  rank_ = rank;
  local_pids_ = std::move(local_pids);
  eps_.resize(addresses.size());
  for (int r = 0; r < int(addresses.size()); ++r) {
    ep_args_.push_back(std::make_unique<EpArg>(EpArg{this, r}));
    eps_.open(r, addresses[size_t(r)], &Link::on_ep_error, ep_args_.back().get());
  }
  post_notice_recv();
}

void Link::on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* a = static_cast<EpArg*>(arg);
  int expected = -1;
  if (a->link->lost_rank_.compare_exchange_strong(expected, a->rank))
    a->link->lost_reason_ = ucs_status_string(status);
}

Request Link::isend(int rank, const void* buf, size_t bytes, uint64_t tag) {
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_tag_send_nbx(eps_[rank], buf, bytes, tag, &p);
  if (UCS_PTR_IS_ERR(r))
    fail(
        Errc::peer_lost,
        "send to rank " + std::to_string(rank) + " failed: " + ucs_status_string(UCS_PTR_STATUS(r)),
        {});
  return Request{r, false};
}

// Always a request, even for a message already here (UCX would complete that one at once, with no
// request to ask its size): wait() checks every receive's size. (Not recv_info: UCX writes it when
// the receive completes, after this frame is gone.)
Request Link::irecv(void* buf, size_t bytes, uint64_t tag) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_.get(), buf, bytes, tag, ~uint64_t(0), &p);
  if (UCS_PTR_IS_ERR(r)) {
    const ucs_status_t st = UCS_PTR_STATUS(r);
    if (st == UCS_ERR_MESSAGE_TRUNCATED)
      fail(Errc::invalid_input, size_mismatch(ucp_tag_recv_info_t{}, bytes, st), {});
    fail(Errc::io, std::string("receive failed: ") + ucs_status_string(st), {});
  }
  return Request{r, true, bytes};
}

void Link::wait(std::vector<Request>& reqs, size_t from, size_t to,
                std::chrono::milliseconds idle_timeout) {
  auto last_progress = Clock::now();
  idle_checked_ = last_progress;
  unsigned idle = 0;
  while (true) {
    bool all = true;
    for (size_t i = from; i < to; ++i) {
      Request& r = reqs[i];
      if (!r.handle) continue;
      ucp_tag_recv_info_t info{};
      ucs_status_t st = r.is_recv ? ucp_tag_recv_request_test(r.handle, &info)
                                  : ucp_request_check_status(r.handle);
      if (st == UCS_INPROGRESS) {
        all = false;
        continue;
      }
      ucp_request_free(r.handle);
      r.handle = nullptr;
      last_progress = Clock::now();
      if (r.is_recv &&
          (st == UCS_ERR_MESSAGE_TRUNCATED || (st == UCS_OK && info.length != r.bytes)))
        fail(Errc::invalid_input, size_mismatch(info, r.bytes, st), reqs);
      if (st != UCS_OK) {
        int lost = lost_rank_.load();
        fail(Errc::peer_lost,
             lost >= 0 ? "rank " + std::to_string(lost) + " lost: " + lost_reason_
                       : std::string("transfer failed: ") + ucs_status_string(st),
             reqs);
      }
    }
    if (all) return;
    give_up_if_failed(reqs);
    if (ucp_worker_progress(worker_.get()) != 0) {
      idle = 0;
      continue;
    }
    if (++idle % 64 == 0) {
      give_up_if_idle(last_progress, idle_timeout, reqs);
      sched_yield();  // several ranks may share a core
    }
  }
}

// A message of another size than the receive's: the members called one operation with different
// sizes (a count, a data type or a model of their own that differ). Named, not a wait that ends
// in timed_out on tags that never match.
std::string Link::size_mismatch(const ucp_tag_recv_info_t& info, size_t expected, ucs_status_t st) {
  const std::string got = st == UCS_ERR_MESSAGE_TRUNCATED
                              ? "more than " + std::to_string(expected) + " bytes"
                              : std::to_string(info.length) + " bytes";
  return "a member sent " + got + " where this member (rank " + std::to_string(rank_) +
         ") expected " + std::to_string(expected) +
         ": the members called the same operation with different sizes (a count, a data type or "
         "a model that differ)";
}

void Link::check_usable() {
  if (broken_) throw *broken_;
  if (aborted_.load()) fail(Errc::aborted, "the communicator was aborted", {});
}

// ---- giving up -------------------------------------------------------------------------------

void Link::give_up_if_failed(std::vector<Request>& reqs) {
  if (aborted_.load()) fail(Errc::aborted, "the communicator was aborted", reqs);
  if (notice_arrived()) fail_from_notice(reqs);
  int lost = lost_rank_.load();
  if (lost >= 0) {
    // A member that gave up closes its endpoints right after its notice: give the notice a
    // moment to arrive, so that the cause, not the teardown, is reported.
    auto until = Clock::now() + kDrainTime;
    while (Clock::now() < until) {
      ucp_worker_progress(worker_.get());
      if (notice_arrived()) fail_from_notice(reqs);
    }
    fail(Errc::peer_lost, "rank " + std::to_string(lost) + " lost: " + lost_reason_, reqs);
  }
}

// After no progress since last_progress: a co-located member whose process is gone becomes the
// lost member (give_up_if_failed reports it); past the idle timeout, timed_out. A gap since the
// previous check longer than half the timeout is this process's own (stopped, a paused VM,
// starved): it saw nothing either, so last_progress moves on by it less a quarter of the timeout
// (a pause of the whole machine fails no collective; checks that always come late still time
// out, within four of them); the others' silence is counted while it runs.
void Link::give_up_if_idle(Clock::time_point& last_progress, std::chrono::milliseconds idle,
                           std::vector<Request>& reqs) {
  auto now = Clock::now();
  if (now - idle_checked_ > idle / 2)  // (a quarter of the timeout still counted: bounded)
    last_progress = std::min(now, last_progress + (now - idle_checked_) - idle / 4);
  idle_checked_ = now;
  if (now - last_progress > kDrainTime && now - last_liveness_check_ > kDrainTime) {
    last_liveness_check_ = now;
    for (int r = 0; r < int(local_pids_.size()); ++r) {
      if (local_pids_[size_t(r)] > 0 && process_gone(local_pids_[size_t(r)])) {
        int expected = -1;
        if (lost_rank_.compare_exchange_strong(expected, r))
          lost_reason_ = "process " + std::to_string(local_pids_[size_t(r)]) + " is gone";
      }
    }
    if (stall_check.check)
      if (std::string why = stall_check.check(stall_check.of); !why.empty())
        fail(Errc::invalid_input, why, reqs);
  }
  if (now - last_progress > idle)
    fail(Errc::timed_out,
         "no progress for " + std::to_string(idle.count()) +
             " ms (a member is stopped, hung or unreachable)",
         reqs);
}

void Link::shm_idle(uint64_t spins, std::chrono::milliseconds idle) {
  std::vector<Request> none;
  if (aborted_.load()) fail(Errc::aborted, "the communicator was aborted", none);
  if (spins <= 32) shm_wait_start_ = idle_checked_ = Clock::now();
  if (spins % 256 == 0) {
    ucp_worker_progress(worker_.get());
    give_up_if_idle(shm_wait_start_, idle, none);
    give_up_if_failed(none);
  }
  // Spin a little first when every rank has a core of its own (a wait between ranks in step is
  // a few microseconds; a yield is a system call), yield at once when they share cores.
  if (oversubscribed_ || spins > 1024) sched_yield();
}

void Link::fail(Errc code, const std::string& why, std::vector<Request> outstanding,
                bool tell_others) {
  std::vector<void*> handles;
  for (auto& r : outstanding) {
    if (!r.handle) continue;
    if (r.is_recv) ucp_request_cancel(worker_.get(), r.handle);
    handles.push_back(r.handle);
    r.handle = nullptr;
  }
  if (tell_others) send_notices(code);
  eps_.close();
  drain(worker_.get(), std::move(handles), Clock::now() + kDrainTime);
  broken_ = Error(
      code, why + " (generation " + std::to_string(gen_) + ", rank " + std::to_string(rank_) + ")");
  throw *broken_;
}

void Link::fail_pending(std::vector<Request>& reqs) {
  std::vector<void*> handles;
  for (auto& r : reqs) handles.push_back(std::exchange(r.handle, nullptr));
  drain(worker_.get(), std::move(handles), Clock::now() + kDrainTime);
  throw;
}

// ---- failure notices -------------------------------------------------------------------------

void Link::post_notice_recv() {
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_.get(), &notice_in_, sizeof notice_in_,
                                        make_tag(gen_, 0, kNotice, 0, 0, 0), kAnySourceMask, &p);
  notice_req_ = UCS_PTR_IS_ERR(r) ? nullptr : r;
}

bool Link::notice_arrived() {
  if (!notice_req_ || in_progress(notice_req_)) return false;
  ucp_request_free(notice_req_);
  notice_req_ = nullptr;
  return true;
}

// Tells every other member why this one gives up (best effort, bounded).
void Link::send_notices(Errc code) {
  notice_out_ = Notice{uint32_t(code), rank_};
  std::vector<void*> sent;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || !eps_[r] || r == lost_rank_.load()) continue;
    ucp_request_param_t p{};
    ucs_status_ptr_t q = ucp_tag_send_nbx(eps_[r], &notice_out_, sizeof notice_out_,
                                          make_tag(gen_, 0, kNotice, 0, uint64_t(rank_), 0), &p);
    if (q && !UCS_PTR_IS_ERR(q)) sent.push_back(q);
  }
  auto deadline = Clock::now() + kDrainTime;
  for (void* q : sent) {
    while (in_progress(q) && Clock::now() < deadline) ucp_worker_progress(worker_.get());
    if (in_progress(q)) ucp_request_cancel(worker_.get(), q);
  }
  drain(worker_.get(), std::move(sent), Clock::now() + kDrainTime);
}

void Link::fail_from_notice(std::vector<Request>& reqs) {
  Errc code = Errc(notice_in_.code);
  if (code != Errc::peer_lost && code != Errc::timed_out && code != Errc::aborted &&
      code != Errc::invalid_input)
    code = Errc::peer_lost;
  fail(code,
       std::string(errc_name(code)) + " reported by rank " + std::to_string(notice_in_.origin) +
           kGaveUpFirst,
       reqs, /*tell_others=*/false);
}

}  // namespace troupe::comm::ucx
