#include "comm/ucx_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "comm/hex.h"
#include "comm/host_identity.h"
#include "comm/reduce.h"
#include "comm/shm_allreduce.h"
#include "comm/ucx_algorithms.h"

namespace troupe::comm {

using ucx::Group;
using ucx::kCollective;
using ucx::kPointToPoint;
using ucx::Request;

struct UcxCommunicator::Impl {
  Group group;
  std::unique_ptr<ShmAllreduce> shm;  // the whole communicator, when every member is on this host
  std::string shm_why_not = "not connected";

  ucx::Link& link() { return *group.link; }
  std::chrono::milliseconds timeout(const CollectiveOptions& o) const {
    return o.timeout.count() > 0 ? o.timeout : group.link->options().timeout;
  }
  void check_peer(int peer, const char* what) {
    if (peer < 0 || peer >= group.size() || peer == group.rank)
      TROUPE_FAIL(Errc::invalid_input, std::string(what) + " rank " + std::to_string(peer));
  }
  void setup_shm(const std::vector<int>& pids, bool all_local, std::chrono::milliseconds to);
};

namespace {

// One member's "PID@HOST@UCX-ADDRESS" (hex), as connect() reads it.
struct MemberAddress {
  int pid = 0;
  std::string host;
  std::vector<uint8_t> ucx;
};

MemberAddress parse_address(const std::string& text, int rank) {
  auto a = text.find('@'), b = text.find('@', a == std::string::npos ? 0 : a + 1);
  if (a == std::string::npos || b == std::string::npos)
    TROUPE_FAIL(Errc::invalid_input,
                "member address " + std::to_string(rank) + " is not PID@HOST@UCX-ADDRESS");
  return {std::atoi(text.substr(0, a).c_str()), text.substr(a + 1, b - a - 1),
          from_hex(text.substr(b + 1))};
}

}  // namespace

// Sets up the shared-memory allreduce when every member is on this host. Every member comes to
// the same decision: an allgather of what each asks for and of its segment, then an agreement
// that every member mapped every segment. Otherwise everyone keeps the ring, and shm_why_not
// says why.
void UcxCommunicator::Impl::setup_shm(const std::vector<int>& pids, bool all_local,
                                      std::chrono::milliseconds to) {
  const int n = group.size(), me = group.rank;
  const UcxCommOptions& opt = link().options();
  shm_why_not = "";
  if (!all_local || n < 2 || n > 64) {
    shm_why_not = n < 2        ? "one member"
                  : !all_local ? "not every member is on this host"
                               : "more than 64 members";
    return;
  }
  // What this rank asks for and offers: shared memory on, slice, switch size, fd, identity, and
  // its registered buffers' fd, size and identity.
  constexpr int kFields = 8;
  std::unique_ptr<ShmAllreduce> mine;
  std::vector<int64_t> all(size_t(n) * kFields, 0);
  int64_t* f = &all[size_t(me) * kFields];
  f[0] = opt.shared_memory;
  f[1] = int64_t(ShmAllreduce::slice_for(n, opt.shm_slice_bytes));
  f[2] = int64_t(opt.shm_min_bytes);
  f[3] = -1;
  if (opt.shared_memory) {
    std::random_device rd;
    uint64_t identity = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
    mine = std::make_unique<ShmAllreduce>(me, n, opt.shm_slice_bytes, identity);
    f[3] = mine->fd();
    f[4] = int64_t(identity);
  }
  f[5] = opt.registered ? opt.registered->fd() : -1;
  f[6] = opt.registered ? int64_t(opt.registered->mapped_bytes()) : 0;
  f[7] = opt.registered ? int64_t(opt.registered->identity()) : 0;
  ucx::ring_allgather(group, reinterpret_cast<uint8_t*>(all.data()),
                      ucx::equal_segments(kFields, n), sizeof(int64_t), 0, ++group.seq, 0, to);
  std::string why;
  std::vector<int> fds(static_cast<size_t>(n));
  std::vector<uint64_t> identities(static_cast<size_t>(n));
  std::vector<ShmAllreduce::ArenaRef> arenas(static_cast<size_t>(n));
  for (int r = 0; r < n && why.empty(); ++r) {
    const int64_t* g = &all[size_t(r) * kFields];
    if (!g[0])
      why = "rank " + std::to_string(r) + " has shared memory off";
    else if (g[1] != all[1] || g[2] != all[2])  // (rank 0's: the same reason everywhere)
      why = "rank " + std::to_string(r) + "'s shared-memory options differ from rank 0's";
    fds[size_t(r)] = int(g[3]);
    identities[size_t(r)] = uint64_t(g[4]);
    arenas[size_t(r)] = {int(g[5]), uint64_t(g[6]), uint64_t(g[7])};
  }
  // Every rank reaches the same answer so far; attaching may fail on some.
  std::string attach_why = why.empty() ? mine->attach(pids, fds, identities) : "";
  if (why.empty() && attach_why.empty())
    attach_why = mine->attach_arenas(opt.registered, pids, arenas);
  double failures = attach_why.empty() ? 0 : 1;
  ucx::allreduce_recursive_doubling(group, reinterpret_cast<uint8_t*>(&failures), 1, DataType::f64,
                                    ++group.seq, to);
  if (why.empty() && failures == 0)
    shm = std::move(mine);
  else
    shm_why_not = !why.empty()          ? why
                  : !attach_why.empty() ? attach_why
                                        : std::to_string(int(failures)) +
                                              " other member(s) could not map the segments";
  const int cores = usable_cores();
  link().set_oversubscribed(cores > 0 && n > cores);
}

UcxCommunicator::UcxCommunicator(uint64_t generation, const UcxCommOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->group.link = std::make_shared<ucx::Link>(generation, options);
}

UcxCommunicator::UcxCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UcxCommunicator::~UcxCommunicator() = default;

std::string UcxCommunicator::address() const {
  ucp_worker_h w = impl_->link().worker();
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  TROUPE_UCS_CHECK(ucp_worker_get_address(w, &addr, &len));
  std::string hex = to_hex(addr, len);
  ucp_worker_release_address(w, addr);
  return std::to_string(getpid()) + "@" + host_identity() + "@" + hex;
}

void UcxCommunicator::connect(int rank, const std::vector<std::string>& addresses,
                              std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  const int n = int(addresses.size());
  if (addresses.empty() || rank < 0 || rank >= n)
    TROUPE_FAIL(Errc::invalid_input, "rank " + std::to_string(rank) +
                                         " is not in a member list of " + std::to_string(n));
  if (n > 4095) TROUPE_FAIL(Errc::invalid_input, "at most 4095 members");
  const std::string me = host_identity();
  std::vector<std::vector<uint8_t>> ucx_addresses;
  std::vector<int> pids(size_t(n), 0), local_pids(size_t(n), 0);
  bool all_local = true;
  for (int r = 0; r < n; ++r) {
    MemberAddress a = parse_address(addresses[size_t(r)], r);
    const bool local = a.host == me;
    if (local && a.pid != getpid()) local_pids[size_t(r)] = a.pid;
    pids[size_t(r)] = a.pid;
    all_local = all_local && local && a.pid > 0;
    ucx_addresses.push_back(std::move(a.ucx));
  }
  m.link().connect(rank, ucx_addresses, std::move(local_pids));
  m.group.rank = rank;
  m.group.members.resize(size_t(n));
  for (int r = 0; r < n; ++r) m.group.members[size_t(r)] = r;
  CollectiveOptions o;
  o.timeout = timeout;
  barrier(o);
  m.setup_shm(pids, all_local, timeout);
}

bool UcxCommunicator::shared_memory_allreduce() const { return impl_->shm != nullptr; }
std::string UcxCommunicator::shared_memory_fallback_reason() const { return impl_->shm_why_not; }
uint64_t UcxCommunicator::registered_allreduces() const {
  return impl_->shm ? impl_->shm->registered_calls() : 0;
}

int UcxCommunicator::rank() const { return impl_->group.rank; }
int UcxCommunicator::size() const { return impl_->group.size(); }
uint64_t UcxCommunicator::generation() const { return impl_->link().generation(); }

void UcxCommunicator::abort() { impl_->link().abort(); }

void UcxCommunicator::allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                const CollectiveOptions& options) {
  check_reduction(type, op);
  Impl& m = *impl_;
  m.link().check_usable();
  const uint64_t s = ++m.group.seq;
  const size_t es = element_size(type), bytes = count * es;
  const int n = m.group.size();
  auto* buf = static_cast<uint8_t*>(out);
  auto to = m.timeout(options);
  const UcxCommOptions& opt = m.link().options();
  // (Members that pass different sizes may take different paths: said, not timed out.)
  struct Watch {
    ucx::Link& link;
    ~Watch() { link.stall_check = {}; }
  } watch{m.link()};
  if (m.shm) {
    m.shm->entered(s, bytes);
    m.link().stall_check = {[](const void* shm) {
                              const std::string why =
                                  static_cast<const ShmAllreduce*>(shm)->split();
                              return why.empty() ? why : "allreduce calls differ: " + why;
                            },
                            m.shm.get()};
  }
  Algorithm a = options.algorithm;
  if (a == Algorithm::automatic) {
    // Shared memory for the smallest calls (whole, through the headers) and from shm_min_bytes
    // up (chunked); recursive doubling over UCX between those.
    const bool shm_size = bytes <= ShmAllreduce::kSmallBytes || bytes >= opt.shm_min_bytes;
    a = m.shm && shm_size                              ? Algorithm::shared_memory
        : bytes < opt.small_bytes || count < size_t(n) ? Algorithm::recursive_doubling
                                                       : Algorithm::ring;
  }
  if (a == Algorithm::shared_memory && !m.shm) a = Algorithm::ring;
  if (a == Algorithm::shared_memory && n > 1 && count > 0) {
    // Reads in, writes out: no copy up front.
    std::string mismatch;
    try {
      mismatch =
          m.shm->run(static_cast<const uint8_t*>(in ? in : out), buf, count, type,
                     op == ReduceOp::avg, [&](uint64_t spins) { m.link().shm_idle(spins, to); });
    } catch (const ShmAllreduce::Abandoned& e) {
      m.link().fail(e.code, e.what(), {});
    }
    if (!mismatch.empty())
      m.link().fail(Errc::invalid_input, "allreduce calls differ: " + mismatch, {});
    return;
  }
  if (in && in != out && bytes) std::memcpy(buf, in, bytes);
  if (n == 1 || count == 0) return;
  if (a == Algorithm::recursive_doubling) {
    ucx::allreduce_recursive_doubling(m.group, buf, count, type, s, to);
  } else {
    auto sg = ucx::split_evenly(count, n);
    ucx::ring_reduce_scatter(m.group, buf, sg, type, 0, s, to);
    ucx::ring_allgather(m.group, buf, sg, es, 1, s, uint64_t(1) << 19, to);
  }
  if (op == ReduceOp::avg) scale_down(buf, count, type, n);
}

void UcxCommunicator::broadcast(void* buf, size_t count, DataType type, int root,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.link().check_usable();
  if (root < 0 || root >= m.group.size())
    TROUPE_FAIL(Errc::invalid_input, "broadcast root " + std::to_string(root) + " is not a rank");
  const uint64_t s = ++m.group.seq;
  const size_t bytes = count * element_size(type);
  if (m.group.size() == 1 || bytes == 0) return;
  ucx::broadcast_binomial(m.group, static_cast<uint8_t*>(buf), bytes, root, s, m.timeout(options));
}

void UcxCommunicator::allgather(const void* in, void* out, size_t count, DataType type,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.link().check_usable();
  const uint64_t s = ++m.group.seq;
  const size_t es = element_size(type);
  const int n = m.group.size();
  auto* buf = static_cast<uint8_t*>(out);
  uint8_t* mine = buf + size_t(m.group.rank) * count * es;
  if (in && in != mine && count) std::memcpy(mine, in, count * es);
  if (n == 1 || count == 0) return;
  ucx::ring_allgather(m.group, buf, ucx::equal_segments(count, n), es, 0, s, 0, m.timeout(options));
}

void UcxCommunicator::reduce_scatter(const void* in, void* out, size_t count, DataType type,
                                     ReduceOp op, const CollectiveOptions& options) {
  check_reduction(type, op);
  Impl& m = *impl_;
  m.link().check_usable();
  const uint64_t s = ++m.group.seq;
  const size_t es = element_size(type);
  const int n = m.group.size();
  if (n == 1 || count == 0) {
    if (count && in != out) std::memmove(out, in, count * es);
    if (op == ReduceOp::avg && count) scale_down(out, count, type, 1);
    return;
  }
  // Work on a copy: the caller's input stays as it was.
  Buffer work(count * size_t(n) * es);
  std::memcpy(work.data(), in, count * size_t(n) * es);
  ucx::ring_reduce_scatter(m.group, work.data(), ucx::equal_segments(count, n), type, -1, s,
                           m.timeout(options));
  std::memcpy(out, work.data() + size_t(m.group.rank) * count * es, count * es);
  if (op == ReduceOp::avg) scale_down(out, count, type, n);
}

void UcxCommunicator::send(const void* buf, size_t bytes, int peer, Tag tag,
                           const CollectiveOptions& options) {
  send_many({Span{const_cast<void*>(buf), bytes}}, peer, tag, options);
}

void UcxCommunicator::recv(void* buf, size_t bytes, int peer, Tag tag,
                           const CollectiveOptions& options) {
  recv_many({Span{buf, bytes}}, peer, tag, options);
}

void UcxCommunicator::send_many(const std::vector<Span>& spans, int peer, Tag tag,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.link().check_usable();
  m.check_peer(peer, "send to");
  std::vector<Request> reqs;
  for (const Span& s : spans)
    reqs.push_back(m.group.isend(peer, s.data, s.bytes,
                                 m.group.tag(kPointToPoint, tag.value(), m.group.rank, 0)));
  if (!reqs.empty()) m.link().wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::recv_many(const std::vector<Span>& spans, int peer, Tag tag,
                                const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.link().check_usable();
  m.check_peer(peer, "recv from");
  std::vector<Request> reqs;
  for (const Span& s : spans)
    reqs.push_back(
        m.group.irecv(s.data, s.bytes, m.group.tag(kPointToPoint, tag.value(), peer, 0)));
  if (!reqs.empty()) m.link().wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::sendrecv(const void* send_buf, size_t send_bytes, int send_peer,
                               void* recv_buf, size_t recv_bytes, int recv_peer, Tag tag,
                               const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.link().check_usable();
  if (send_peer != -1) m.check_peer(send_peer, "sendrecv with");
  if (recv_peer != -1) m.check_peer(recv_peer, "sendrecv with");
  std::vector<Request> reqs;
  if (recv_peer >= 0)
    reqs.push_back(
        m.group.irecv(recv_buf, recv_bytes, m.group.tag(kPointToPoint, tag.value(), recv_peer, 0)));
  if (send_peer >= 0)
    reqs.push_back(m.group.isend(send_peer, send_buf, send_bytes,
                                 m.group.tag(kPointToPoint, tag.value(), m.group.rank, 0)));
  if (!reqs.empty()) m.link().wait_all(reqs, m.timeout(options));
}

void UcxCommunicator::barrier(const CollectiveOptions& options) {
  Impl& m = *impl_;
  m.link().check_usable();
  const uint64_t s = ++m.group.seq;
  if (m.group.size() == 1) return;
  ucx::barrier_dissemination(m.group, s, m.timeout(options));
}

// Every member contributes (color, key, the next free context); the new groups take the largest
// next free context (so every member of the parent agrees, whatever groups each made before) and
// are ranked by (key, rank).
std::unique_ptr<Communicator> UcxCommunicator::split(int color, int key,
                                                     const CollectiveOptions& options) {
  Impl& m = *impl_;
  const int n = m.group.size();
  std::vector<int64_t> all(size_t(n) * 3);
  const int64_t mine[3] = {color, key, int64_t(m.link().next_context)};
  allgather(mine, all.data(), 3, DataType::f64, options);  // (8-byte elements, copied whole)
  int64_t context = 0;
  for (int r = 0; r < n; ++r) context = std::max(context, all[size_t(r) * 3 + 2]);
  if (context >= int64_t(ucx::kMaxContexts))
    TROUPE_FAIL(Errc::invalid_input,
                "more than " + std::to_string(ucx::kMaxContexts - 1) + " groups in one generation");
  m.link().next_context = uint32_t(context + 1);
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> order;  // (key, rank) of the members with this color
  for (int r = 0; r < n; ++r)
    if (all[size_t(r) * 3] == color) order.push_back({all[size_t(r) * 3 + 1], r});
  std::sort(order.begin(), order.end());
  auto impl = std::make_unique<Impl>();
  impl->group.link = m.group.link;
  impl->group.context = uint32_t(context);
  for (auto [k, r] : order) {
    if (r == m.group.rank) impl->group.rank = int(impl->group.members.size());
    impl->group.members.push_back(m.group.members[size_t(r)]);
  }
  impl->shm_why_not =
      "a group of the communicator (the shared-memory allreduce is the whole one's)";
  return std::unique_ptr<Communicator>(new UcxCommunicator(std::move(impl)));
}

}  // namespace troupe::comm
