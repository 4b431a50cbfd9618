#include "tests/harness/guarded_link.h"

#include <chrono>
#include <functional>
#include <future>
#include <vector>

#include "comm/error.h"

namespace troupe::testing {
namespace {

constexpr std::chrono::milliseconds kAbandonAfter{200};  // (NcclOptions::abandon_after)

class GuardedLink final : public comm::Communicator {
 public:
  using Abandoned = std::function<bool()>;
  GuardedLink(GuardedCompute& device, comm::Communicator& host, Abandoned abandoned)
      : dev_(device), host_(host), abandoned_(std::move(abandoned)) {}
  // A group's: over the host communicator's group of the same members, which it owns.
  GuardedLink(GuardedCompute& device, std::unique_ptr<comm::Communicator> group,
              Abandoned abandoned)
      : dev_(device), owned_(std::move(group)), host_(*owned_), abandoned_(std::move(abandoned)) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  uint64_t generation() const override { return host_.generation(); }

  void allreduce(const void* in, void* out, size_t count, comm::DataType t, comm::ReduceOp op,
                 const comm::CollectiveOptions& o) override {
    waited("allreduce", [&] { host_.allreduce(real(in), real(out), count, t, op, o); });
  }
  void broadcast(void* buf, size_t count, comm::DataType t, int root,
                 const comm::CollectiveOptions& o) override {
    waited("broadcast", [&] { host_.broadcast(real(buf), count, t, root, o); });
  }
  void allgather(const void* in, void* out, size_t count, comm::DataType t,
                 const comm::CollectiveOptions& o) override {
    waited("allgather", [&] { host_.allgather(real(in), real(out), count, t, o); });
  }
  void reduce_scatter(const void* in, void* out, size_t count, comm::DataType t, comm::ReduceOp op,
                      const comm::CollectiveOptions& o) override {
    waited("reduce_scatter", [&] { host_.reduce_scatter(real(in), real(out), count, t, op, o); });
  }
  void send(const void* buf, size_t bytes, int peer, comm::Tag tag,
            const comm::CollectiveOptions& o) override {
    waited("send", [&] { host_.send(real(buf), bytes, peer, tag, o); });
  }
  void recv(void* buf, size_t bytes, int peer, comm::Tag tag,
            const comm::CollectiveOptions& o) override {
    waited("recv", [&] { host_.recv(real(buf), bytes, peer, tag, o); });
  }
  void send_many(const std::vector<comm::Span>& spans, int peer, comm::Tag tag,
                 const comm::CollectiveOptions& o) override {
    waited("send_many", [&] { host_.send_many(real(spans), peer, tag, o); });
  }
  void recv_many(const std::vector<comm::Span>& spans, int peer, comm::Tag tag,
                 const comm::CollectiveOptions& o) override {
    waited("recv_many", [&] { host_.recv_many(real(spans), peer, tag, o); });
  }
  void sendrecv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                size_t recv_bytes, int recv_peer, comm::Tag tag,
                const comm::CollectiveOptions& o) override {
    waited("sendrecv", [&] {
      host_.sendrecv(real(send_buf), send_bytes, send_peer, real(recv_buf), recv_bytes, recv_peer,
                     tag, o);
    });
  }
  void barrier(const comm::CollectiveOptions& o) override {
    waited("barrier", [&] { host_.barrier(o); });
  }
  std::unique_ptr<comm::Communicator> split(int color, int key,
                                            const comm::CollectiveOptions& o) override {
    auto group = host_.split(color, key, o);
    if (!group) return nullptr;
    return std::make_unique<GuardedLink>(dev_, std::move(group), abandoned_);
  }
  // (The host communicator is the generation's: its owner aborts it, and so a group's.)
  void abort() override {}

 private:
  // Waits as NCCL's operations are waited on (comm/nccl_communicator.cpp): the operation runs on
  // a thread of its own while this one polls; one still waiting kAbandonAfter past its start when
  // the generation is abandoned is given up (the host communicator aborted, as NCCL's would be).
  template <typename Op>
  void waited(const char* what, Op op) {
    if (!abandoned_) return op();
    std::future<void> running = std::async(std::launch::async, op);
    const auto start = std::chrono::steady_clock::now();
    bool given_up = false;
    while (running.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
      if (!given_up && std::chrono::steady_clock::now() - start > kAbandonAfter && abandoned_()) {
        given_up = true;
        host_.abort();
      }
    }
    if (given_up)
      TROUPE_FAIL(comm::Errc::peer_lost, std::string(what) +
                                             ": given up, the generation is being ended (a "
                                             "member is gone; the device plane's stand-in)");
    running.get();
  }

  void* real(const void* p) { return dev_.real(p); }
  std::vector<comm::Span> real(const std::vector<comm::Span>& spans) {
    std::vector<comm::Span> r;
    for (const comm::Span& s : spans) r.push_back({real(s.data), s.bytes});
    return r;
  }
  GuardedCompute& dev_;
  std::unique_ptr<comm::Communicator> owned_;  // a group's host communicator
  comm::Communicator& host_;
  Abandoned abandoned_;
};

}  // namespace

std::unique_ptr<comm::Communicator> guarded_link(GuardedCompute& device, comm::Communicator& host,
                                                 std::function<bool()> abandoned) {
  return std::make_unique<GuardedLink>(device, host, std::move(abandoned));
}

}  // namespace troupe::testing
