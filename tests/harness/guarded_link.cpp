#include "tests/harness/guarded_link.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "comm/error.h"

namespace troupe::testing {
namespace {

constexpr std::chrono::milliseconds kAbandonAfter{200};  // (NcclOptions::abandon_after)

class GuardedLink final : public comm::Communicator {
 public:
  using Abandoned = std::function<bool()>;
  GuardedLink(GuardedCompute& device, comm::Communicator& host, Abandoned abandoned)
      : dev_(device), host_(host), abandoned_(std::move(abandoned)) {
    watch();
  }
  // A group's: over the host communicator's group of the same members, which it owns.
  GuardedLink(GuardedCompute& device, std::unique_ptr<comm::Communicator> group,
              Abandoned abandoned)
      : dev_(device), owned_(std::move(group)), host_(*owned_), abandoned_(std::move(abandoned)) {
    watch();
  }
  ~GuardedLink() override {
    closing_.store(true);
    if (watcher_.joinable()) watcher_.join();
  }

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
  // Its operations are waited on as NCCL's are (comm/nccl_communicator.cpp): one still waiting
  // kAbandonAfter past its start once the generation is abandoned is given up, the host
  // communicator aborted (from the watcher's thread; the operation stays on its caller's).
  void watch() {
    if (!abandoned_) return;
    watcher_ = std::thread([this] {
      while (!closing_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const int64_t since = started_ns_.load();
        if (since != 0 && !given_up_.load() && now_ns() - since > kAbandonAfter.count() * 1000000 &&
            abandoned_()) {
          given_up_.store(true);
          host_.abort();
        }
      }
    });
  }
  template <typename Op>
  void waited(const char* what, Op op) {
    started_ns_.store(now_ns());
    try {
      op();
    } catch (const comm::Error&) {
      started_ns_.store(0);
      if (!given_up_.load()) throw;
      TROUPE_FAIL(comm::Errc::peer_lost, std::string(what) +
                                             ": given up, the generation is being ended (a "
                                             "member is gone; the device plane's stand-in)");
    }
    started_ns_.store(0);
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
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
  std::atomic<int64_t> started_ns_{0};  // the operation under way's start (0: none)
  std::atomic<bool> given_up_{false}, closing_{false};
  std::thread watcher_;
};

}  // namespace

std::unique_ptr<comm::Communicator> guarded_link(GuardedCompute& device, comm::Communicator& host,
                                                 std::function<bool()> abandoned) {
  return std::make_unique<GuardedLink>(device, host, std::move(abandoned));
}

}  // namespace troupe::testing
