#include "workers/gradient_sum.h"

#include "workers/device_plane.h"
#include "workers/host_staging.h"
#include "workers/registered_gradients.h"

namespace troupe::workers {

GradientSum::GradientSum(models::Model& model, bool bf16, std::chrono::milliseconds timeout,
                         InPlaceBuffers* in_place)
    : model_(model),
      bf16_(bf16),
      timeout_(timeout),
      in_place_(in_place),
      half_(bf16 ? model.num_blocks() : 0),
      ready_(model.num_blocks()) {}

models::Tensor& GradientSum::bucket(size_t b) { return bf16_ ? half_[b] : model_.block(b).grads(); }

void GradientSum::prepare(size_t b, comm::Communicator* device_plane) {
  models::Tensor& g = model_.block(b).grads();
  models::Compute& on = compute_of(g);
  if (bf16_) {
    if (!half_[b].defined() && in_place_)
      half_[b] = in_place_->take(InPlaceBuffers::kHalves + b, (g.numel() + 1) / 2, on);
    if (!half_[b].defined()) half_[b] = on.tensor({(g.numel() + 1) / 2});
    on.to_bf16(reinterpret_cast<uint16_t*>(half_[b].data()), g.data(), g.numel());
  }
  ready_[b] = device_plane ? on.fence() : nullptr;
  prepared_.push_back(b);
}

bool GradientSum::reduce(size_t b, comm::Communicator& host, comm::Communicator* device_plane) {
  models::Tensor& t = bucket(b);
  const size_t count = model_.block(b).grads().numel();
  const comm::DataType type = bf16_ ? comm::DataType::bf16 : comm::DataType::f32;
  if (device_plane && t.device() != models::Device::cpu) {
    if (ready_[b]) await_fence(*ready_[b], timeout_);
    device_plane->allreduce(t.data(), t.data(), count, type, comm::ReduceOp::sum);
    return true;
  }
  HostStaged h(t);
  host.allreduce(h.data(), h.data(), count, type, comm::ReduceOp::sum);
  h.store();
  return false;
}

void GradientSum::finish() {
  for (size_t b : prepared_) {
    models::Tensor& g = model_.block(b).grads();
    if (bf16_)
      compute_of(g).from_bf16(g.data(), reinterpret_cast<const uint16_t*>(half_[b].data()),
                              g.numel());
    ready_[b].reset();
  }
  prepared_.clear();
}

}  // namespace troupe::workers
