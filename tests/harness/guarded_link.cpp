#include "tests/harness/guarded_link.h"

#include <vector>

namespace troupe::testing {
namespace {

class GuardedLink final : public comm::Communicator {
 public:
  GuardedLink(GuardedCompute& device, comm::Communicator& host) : dev_(device), host_(host) {}
  // A group's: over the host communicator's group of the same members, which it owns.
  GuardedLink(GuardedCompute& device, std::unique_ptr<comm::Communicator> group)
      : dev_(device), owned_(std::move(group)), host_(*owned_) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  uint64_t generation() const override { return host_.generation(); }

  void allreduce(const void* in, void* out, size_t count, comm::DataType t, comm::ReduceOp op,
                 const comm::CollectiveOptions& o) override {
    host_.allreduce(real(in), real(out), count, t, op, o);
  }
  void broadcast(void* buf, size_t count, comm::DataType t, int root,
                 const comm::CollectiveOptions& o) override {
    host_.broadcast(real(buf), count, t, root, o);
  }
  void allgather(const void* in, void* out, size_t count, comm::DataType t,
                 const comm::CollectiveOptions& o) override {
    host_.allgather(real(in), real(out), count, t, o);
  }
  void reduce_scatter(const void* in, void* out, size_t count, comm::DataType t, comm::ReduceOp op,
                      const comm::CollectiveOptions& o) override {
    host_.reduce_scatter(real(in), real(out), count, t, op, o);
  }
  void send(const void* buf, size_t bytes, int peer, comm::Tag tag,
            const comm::CollectiveOptions& o) override {
    host_.send(real(buf), bytes, peer, tag, o);
  }
  void recv(void* buf, size_t bytes, int peer, comm::Tag tag,
            const comm::CollectiveOptions& o) override {
    host_.recv(real(buf), bytes, peer, tag, o);
  }
  void send_many(const std::vector<comm::Span>& spans, int peer, comm::Tag tag,
                 const comm::CollectiveOptions& o) override {
    host_.send_many(real(spans), peer, tag, o);
  }
  void recv_many(const std::vector<comm::Span>& spans, int peer, comm::Tag tag,
                 const comm::CollectiveOptions& o) override {
    host_.recv_many(real(spans), peer, tag, o);
  }
  void sendrecv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                size_t recv_bytes, int recv_peer, comm::Tag tag,
                const comm::CollectiveOptions& o) override {
    host_.sendrecv(real(send_buf), send_bytes, send_peer, real(recv_buf), recv_bytes, recv_peer,
                   tag, o);
  }
  void barrier(const comm::CollectiveOptions& o) override { host_.barrier(o); }
  std::unique_ptr<comm::Communicator> split(int color, int key,
                                            const comm::CollectiveOptions& o) override {
    auto group = host_.split(color, key, o);
    if (!group) return nullptr;
    return std::make_unique<GuardedLink>(dev_, std::move(group));
  }
  // (The host communicator is the generation's: its owner aborts it, and so a group's.)
  void abort() override {}

 private:
  void* real(const void* p) { return dev_.real(p); }
  std::vector<comm::Span> real(const std::vector<comm::Span>& spans) {
    std::vector<comm::Span> r;
    for (const comm::Span& s : spans) r.push_back({real(s.data), s.bytes});
    return r;
  }
  GuardedCompute& dev_;
  std::unique_ptr<comm::Communicator> owned_;  // a group's host communicator
  comm::Communicator& host_;
};

}  // namespace

std::unique_ptr<comm::Communicator> guarded_link(GuardedCompute& device, comm::Communicator& host) {
  return std::make_unique<GuardedLink>(device, host);
}

}  // namespace troupe::testing
