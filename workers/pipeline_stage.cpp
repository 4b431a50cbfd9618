#include "workers/pipeline_stage.h"

#include <chrono>

#include "workers/exact_sum.h"
#include "workers/host_staging.h"
#include "workers/tags.h"

namespace troupe::workers {
namespace {

using Kind = elastic::PipeOp::Kind;
using What = elastic::PipeMessage::What;

// Adds the lifetime of the scope to a seconds counter.
class Busy {
 public:
  explicit Busy(double& seconds) : seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~Busy() {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point t0_;
};

size_t bytes(const models::Tensor& t) { return t.numel() * sizeof(float); }

}  // namespace

PipelineStage::PipelineStage(models::Model& model, models::Trainer& trainer,
                             const std::vector<std::vector<size_t>>& out_shape, StageLayout layout)
    : model_(model), trainer_(trainer), out_shape_(out_shape), layout_(layout) {}

StageStepResult PipelineStage::run(comm::Communicator& comm, uint64_t step, elastic::Share share,
                                   uint64_t micro, const std::function<void()>& after_backward) {
  step_ = step;
  after_backward_ = after_backward;
  mbs_.clear();
  for (uint64_t at = share.begin; at < share.end; at += micro)
    mbs_.push_back({at, std::min(share.end, at + micro), {}, {}, {}, {}, {}, {}, {}});
  cached_ = -1;
  result_ = {};
  for (const auto& op : elastic::one_f_one_b(layout_.stages, layout_.stage, uint32_t(mbs_.size())))
    switch (op.kind) {
      case Kind::load:
        load(op.micro);
        break;
      case Kind::forward:
        forward(op.micro);
        break;
      case Kind::loss:
        loss(op.micro);
        break;
      case Kind::backward:
        backward(op.micro);
        break;
      case Kind::exchange:
        exchange(comm, op);
        break;
    }
  mbs_.clear();
  return result_;
}

// A block's output for micro-batch j: its one-sample shape with dim 0 scaled (rows of (B, D) or
// (B*T, C), or the batch of (B, T, C)).
models::Tensor PipelineStage::shaped(uint32_t block, uint32_t j) const {
  std::vector<size_t> shape = out_shape_[block];
  shape.at(0) *= rows(j);
  if (plane_) return compute_of(model_.block(layout_.first).params()).tensor(shape);
  return models::Tensor(shape);
}

void PipelineStage::load(uint32_t j) {
  mbs_[j].batch = trainer_.batch(step_, mbs_[j].begin, mbs_[j].end);
  mbs_[j].input = mbs_[j].batch.inputs;
}

// The blocks' cache of micro-batch `cached_`, kept for its backward.
void PipelineStage::put_away() {
  if (cached_ < 0 || layout_.recompute) return;
  for (uint32_t b = layout_.first; b < layout_.last; ++b)
    mbs_[size_t(cached_)].stash.push_back(model_.block(b).save());
  cached_ = -1;
}

void PipelineStage::forward(uint32_t j) {
  put_away();
  Busy timer(result_.busy);
  models::Tensor x = mbs_[j].input;
  mbs_[j].in_numel.resize(layout_.last - layout_.first);
  for (uint32_t b = layout_.first; b < layout_.last; ++b) {
    mbs_[j].in_numel[b - layout_.first] = x.numel();
    x = model_.forward_block(b, x, rows(j));
  }
  mbs_[j].output = x;
  cached_ = int(j);
}

// The loss gradient of the model's output for micro-batch j (the last stage).
void PipelineStage::loss(uint32_t j) {
  Micro& m = mbs_[j];
  if (m.batch.targets.empty()) m.batch = trainer_.batch(step_, m.begin, m.end);
  Busy timer(result_.busy);
  const auto& targets = m.batch.targets;
  const size_t n = targets.size(),
               classes = models::scored_classes(m.output, targets, m.batch.samples);
  models::Compute& c = compute_of(m.output);
  models::Tensor d = c.tensor({n, classes});
  size_t correct = 0;
  const double loss = c.cross_entropy(d.data(), m.output.data(), targets.data(), n, classes,
                                      trainer_.loss_scale(), &correct);
  result_.loss += loss;
  result_.loss_fixed += fixed_point_loss(loss);
  m.grad_out = d;
  m.output = models::Tensor();
}

void PipelineStage::backward(uint32_t j) {
  Micro& m = mbs_[j];
  if (cached_ != int(j) && !m.stash.empty()) {
    put_away();
    for (uint32_t b = layout_.first; b < layout_.last; ++b)
      model_.block(b).restore(m.stash[b - layout_.first]);
    m.stash.clear();
    cached_ = int(j);
  }
  if (cached_ != int(j)) forward(j);  // recompute from the saved input
  Busy timer(result_.busy);
  models::Tensor dy = m.grad_out;
  for (uint32_t b = layout_.last; b-- > layout_.first;)  // (block 0's input: the data)
    dy = model_.backward_block(b, dy, b > 0 ? m.in_numel.at(b - layout_.first) : 0);
  m.grad_in = dy;
  m.input = m.output = m.grad_out = models::Tensor();
  cached_ = -1;
  if (after_backward_) after_backward_();
}

// An activation goes to the next stage (the block output of micro j), a gradient to the
// previous one (its input gradient); a receive allocates the tensor it fills.
void PipelineStage::exchange(comm::Communicator& comm, const elastic::PipeOp& op) {
  models::Tensor out, in;
  int to = -1, from = -1;
  if (op.send) {
    Micro& m = mbs_[op.send->micro];
    const bool act = op.send->what == What::activation;
    out = act ? m.output : m.grad_in;
    (act ? m.output : m.grad_in) = models::Tensor();
    to = act ? layout_.next : layout_.prev;
  }
  if (op.recv) {
    Micro& m = mbs_[op.recv->micro];
    const bool act = op.recv->what == What::activation;
    in = act ? shaped(layout_.first - 1, op.recv->micro) : shaped(layout_.last - 1, op.recv->micro);
    (act ? m.input : m.grad_out) = in;
    from = act ? layout_.prev : layout_.next;
  }
  if (plane_) {
    // Device to device; the compute stream's writes to `out` are done before NCCL's stream reads
    // it, and the receive is complete when the call returns.
    if (out.defined()) compute_of(out).synchronize();
    plane_->sendrecv(out.data(), bytes(out), to, in.data(), bytes(in), from, tags::kPipeline);
    return;
  }
  // (A received tensor is in host memory: the blocks take their inputs from any device.)
  HostStaged sent(static_cast<const models::Tensor&>(out));
  comm.sendrecv(sent.data(), bytes(out), to, in.data(), bytes(in), from, tags::kPipeline);
}

}  // namespace troupe::workers
