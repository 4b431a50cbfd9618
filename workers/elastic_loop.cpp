// The user's own loop (workers/elastic_loop.h) on an agent session: the same protocol as a
// DeviceSupervisor's worker (publish, await, connect, take state, train, report), with the
// user's thread driving it from next_step(), allreduce() and commit(). The whole state is one
// block: the members that lack it as of the generation's start step receive it from the state
// source, point to point.
#include "workers/elastic_loop.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "comm/checksum.h"
#include "comm/ucx_communicator.h"
#include "elastic/membership.h"
#include "workers/agent.h"
#include "workers/agent_session.h"
#include "workers/tags.h"

namespace troupe {

using Clock = std::chrono::steady_clock;

class ElasticLoop::Impl {
 public:
  Impl(const LoopOptions& o, LoopState state);
  ~Impl();

  std::optional<LoopStep> next_step();
  bool allreduce(void* data, size_t count, comm::DataType type);
  void check_in_step(const char* call) const;
  std::optional<double> commit(double loss);
  std::nullopt_t diverged(double loss);
  std::string failed_;  // why this member failed the job (a diverged step): it only ends now
  void* shared(size_t count, size_t element_bytes);
  uint64_t in_place() const;
  std::string leave() { return session_.ask_drain(); }

  LoopJob job;
  int exit_code = 0;
  std::string reason;

 private:
  bool join_generation();  // false: the agent shuts down first
  void publish();
  elastic::Holding holding() const;  // what this member publishes: its state, as of applied_
  void retire_comm();  // counts what the generation's communicator read in place, then drops it
  void take_state(const actors::GenerationStart& g);
  void send_state(const std::vector<uint8_t>& bytes, uint32_t to, double save_ms);
  void receive_state(uint32_t from);
  LoopStep open_step();
  void broken(const comm::Error& e);
  // The job's end for this member: its checksum, then the coordinator's word (true), or the
  // generation left first (false: a member lost before its own report; the others go on).
  bool end_job();

  workers::AgentSession session_;
  std::thread watcher_;
  LoopState state_;
  int64_t failure_timeout_ms_;
  size_t shared_bytes_;
  std::shared_ptr<comm::SharedArena> arena_;  // shared(): registered with each communicator
  std::unique_ptr<comm::UcxCommunicator> comm_;
  uint64_t in_place_before_ = 0;  // allreduces read in place by the communicators before comm_
  uint64_t want_ = 1;             // the generation it publishes for next
  uint64_t applied_ = 0;          // steps applied so far (the state is as of this step)
  bool has_state_ = false;        // a first member starts from its own (identical) initial state
  bool in_generation_ = false, step_open_ = false, stop_voted_ = false, received_ = false;
  bool step_given_ = false;  // from next_step()'s step to its commit() (or the loop's end)
  bool ended_ = false;
  uint32_t rank_ = 0, world_ = 0;
  uint64_t generation_ = 0;
  double lr_ = 0;  // the generation's optimizer.lr
  LoopStep step_;
  Clock::time_point step_start_;
  std::string last_error_;
  uint64_t received_bytes_ = 0;  // the state's size, as received
};

namespace {

workers::AgentOptions agent_options(const LoopOptions& o) {
  workers::AgentOptions a;
  a.join = o.join;
  std::tie(a.job_id, a.token) = workers::read_token_file(o.token_file);
  a.address_file = o.token_file.substr(0, o.token_file.find_last_of('/') + 1) + "coordinator.addr";
  a.name = o.name;
  a.devices = {"cpu:0"};
  a.kinds = {"model:external", "data:external"};
  a.own_heartbeat = o.heartbeat_interval_ms > 0;
  a.own_failure_timeout = o.failure_timeout_ms > 0;
  if (o.heartbeat_interval_ms > 0)
    a.heartbeat_interval = std::chrono::milliseconds(o.heartbeat_interval_ms);
  if (o.failure_timeout_ms > 0) a.failure_timeout = std::chrono::milliseconds(o.failure_timeout_ms);
  return a;
}

}  // namespace

ElasticLoop::Impl::Impl(const LoopOptions& o, LoopState state)
    : session_(agent_options(o)),
      state_(std::move(state)),
      failure_timeout_ms_(session_.spec().failure_timeout_ms),  // (the job's: every member's)
      shared_bytes_(o.shared_bytes) {
  if (!state_.save || !state_.load) throw std::invalid_argument("LoopState needs save and load");
  if (!session_.error().empty()) throw std::runtime_error(session_.error());
  const actors::JobSpec& s = session_.spec();
  if (s.model_kind != "external")
    throw std::runtime_error("job '" + s.job_name + "' trains model.kind = \"" + s.model_kind +
                             "\": a loop of its own joins a job of model.kind = \"external\"");
  job = {s.job_name, s.seed, s.steps, uint64_t(s.global_batch), uint64_t(s.micro_batch), s.lr};
  want_ = s.first_generation;
  has_state_ = s.init_state;  // (a joiner receives it)
  watcher_ = std::thread([this] { session_.watch(nullptr); });
  spdlog::info(
      "loop {} joined job '{}' as agent {} (its data plane waits {} ms for another "
      "member's progress, elastic.failure_timeout_ms)",
      session_.name(), s.job_name, s.agent_id, failure_timeout_ms_);
}

ElasticLoop::Impl::~Impl() {
  if (comm_) comm_->abort();
  session_.board().shut_down(exit_code, "the loop ended");
  watcher_.join();
}

void ElasticLoop::Impl::retire_comm() {
  if (!comm_) return;
  const uint64_t n = comm_->registered_allreduces();
  if (n > 0)
    spdlog::info("loop {}: generation {}: {} allreduces read the members' buffers in place",
                 session_.name(), generation_, n);
  in_place_before_ += n;
  comm_.reset();
}

void ElasticLoop::Impl::publish() {
  retire_comm();
  comm::UcxCommOptions co;
  co.timeout = std::chrono::milliseconds(failure_timeout_ms_);
  co.registered = arena_;
  comm_ = std::make_unique<comm::UcxCommunicator>(want_, co);
  session_.send(actors::encode(actors::WorkerReady{
      {session_.agent_id(), 0}, want_, comm_->address(), holding(), 1, last_error_, {}}));
  last_error_.clear();
}

bool ElasticLoop::Impl::join_generation() {
  auto& board = session_.board();
  while (true) {
    const uint64_t rejoins = board.rejoins();
    publish();
    auto g = board.await(want_, rejoins);
    if (!g && board.shutting_down()) return false;
    if (!g) {  // joined a coordinator again: publish to it
      want_ = board.next_generation();
      continue;
    }
    int rank = -1;
    std::vector<std::string> addresses(g->members.size());
    for (const auto& m : g->members) {
      addresses[m.rank] = m.address;
      if (m.worker.agent == session_.agent_id()) rank = int(m.rank);
    }
    if (rank < 0 || g->generation != want_) {  // a standby, or a newer generation formed
      want_ = g->generation + 1;
      continue;
    }
    try {
      comm_->connect(rank, addresses,
                     std::chrono::milliseconds(std::max<int64_t>(10000, failure_timeout_ms_)));
      rank_ = uint32_t(rank);
      world_ = uint32_t(g->members.size());
      generation_ = g->generation;
      lr_ = g->lr > 0 ? g->lr : job.lr;
      take_state(*g);
    } catch (const comm::Error& e) {
      broken(e);
      continue;
    }
    in_generation_ = true;
    stop_voted_ = false;
    applied_ = g->start_step;
    return true;
  }
}

elastic::Holding ElasticLoop::Impl::holding() const {
  elastic::Holding h;
  h.applied = applied_;
  if (has_state_) h.held = {0};
  return h;
}

// The members whose state is not as of the start step receive it from the state source: its
// size, then its bytes. A member said to hold a state it lacks (a coordinator's bug) would go on
// from its own: it gives its state up (it receives it in the next generation) and the generation
// breaks, naming the claim.
void ElasticLoop::Impl::take_state(const actors::GenerationStart& g) {
  received_ = false;
  for (const auto& m : g.members) {
    const std::string claimed = m.rank == rank_ ? elastic::claims_beyond(m.holding, holding()) : "";
    if (claimed.empty()) continue;
    has_state_ = false;
    throw comm::Error(comm::Errc::internal, "the generation's start says this member holds " +
                                                claimed + ", which it does not");
  }
  const auto t0 = Clock::now();
  auto lacks = [&](const actors::GenerationMember& m) {
    return m.holding.held.empty() || m.holding.applied != g.start_step;
  };
  std::vector<uint8_t> bytes;
  double save_ms = -1;  // (the source saves once, for every member that lacks the state)
  for (const auto& m : g.members) {
    if (!lacks(m) || m.rank == g.state_source) continue;
    if (rank_ == g.state_source) {
      if (save_ms < 0) {
        bytes = state_.save();
        save_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      }
      send_state(bytes, m.rank, save_ms);
    } else if (m.rank == rank_) {
      receive_state(g.state_source);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      session_.send(actors::encode(actors::StateReceived{
          g.generation, rank_, g.state_source, received_bytes_, seconds, true, 1, "", ""}));
    }
  }
}

namespace {

// e with what it was doing in front of its message (the same code).
[[noreturn]] void rethrow_in(const comm::Error& e, const std::string& doing) {
  std::string what = e.what();
  const std::string code = std::string(comm::errc_name(e.code())) + ": ";
  if (what.rfind(code, 0) == 0) what.erase(0, code.size());
  throw comm::Error(e.code(), doing + ": " + what);
}

}  // namespace

// Its size, then its bytes. A save slower than elastic.failure_timeout_ms is a member that makes
// no progress to the ones waiting for it: the error says so.
void ElasticLoop::Impl::send_state(const std::vector<uint8_t>& bytes, uint32_t to, double save_ms) {
  const uint64_t size = bytes.size();
  try {
    comm_->send(&size, sizeof size, int(to), workers::tags::kState);
    comm_->send(bytes.data(), bytes.size(), int(to), workers::tags::kState);
  } catch (const comm::Error& e) {
    rethrow_in(e, "sending the state to rank " + std::to_string(to) +
                      " after LoopState::save took " + std::to_string(int64_t(save_ms)) +
                      " ms (a member waits " + std::to_string(failure_timeout_ms_) +
                      " ms, elastic.failure_timeout_ms, for another's progress)");
  }
}

void ElasticLoop::Impl::receive_state(uint32_t from) {
  uint64_t size = 0;
  std::vector<uint8_t> bytes;
  try {
    comm_->recv(&size, sizeof size, int(from), workers::tags::kState);
    const uint64_t memory = uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
    if (size > memory)  // (a sender's bug: not an allocation that ends the program)
      throw comm::Error(comm::Errc::invalid_input, "rank " + std::to_string(from) +
                                                       " sends a state of " + std::to_string(size) +
                                                       " bytes, more than this machine's memory");
    bytes.resize(size);
    comm_->recv(bytes.data(), bytes.size(), int(from), workers::tags::kState);
  } catch (const comm::Error& e) {
    rethrow_in(e, "waiting for the state from rank " + std::to_string(from) +
                      " (its LoopState::save, then the bytes; each within "
                      "elastic.failure_timeout_ms)");
  }
  state_.load(bytes);
  has_state_ = received_ = true;
  received_bytes_ = size;
}

LoopStep ElasticLoop::Impl::open_step() {
  const elastic::Share share = elastic::data_share(job.global_batch, rank_, world_);
  const uint64_t first = applied_ * job.global_batch;
  step_ = {applied_,          generation_, rank_, world_, first + share.begin,
           first + share.end, received_,   lr_};
  received_ = false;
  step_open_ = step_given_ = true;
  step_start_ = Clock::now();
  return step_;
}

std::optional<LoopStep> ElasticLoop::Impl::next_step() {
  if (ended_) return std::nullopt;
  if (step_open_ && in_generation_)
    throw std::logic_error("next_step() before commit() of step " + std::to_string(step_.step));
  auto& board = session_.board();
  while (true) {
    if (!failed_.empty()) {  // (the job fails with it: the coordinator's shutdown, else ours)
      if (!board.await_shutdown(std::chrono::milliseconds(failure_timeout_ms_ + 10000)))
        board.shut_down(1, failed_);
      break;
    }
    if (board.shutting_down()) break;
    if (!in_generation_) {
      if (!join_generation()) break;
      if (applied_ < job.steps) return open_step();  // (else formed after the last step: the end)
    }
    if (stop_voted_) {  // another member's agent may have heard why first: wait for it here
      board.await_reason(generation_, std::chrono::milliseconds(failure_timeout_ms_ + 5000));
      if (board.shutting_down()) break;
      if (!board.stop_requested() && board.leaving(generation_)) {
        in_generation_ = false;
        ++want_;
        continue;
      }
    }
    if (stop_voted_ || applied_ >= job.steps) {
      if (end_job()) break;
      in_generation_ = false;  // a member lost before its own end report: on without it
      ++want_;
      continue;
    }
    return open_step();
  }
  ended_ = true;
  step_given_ = false;
  exit_code = board.exit_code();
  reason = board.reason();
  return std::nullopt;
}

// A call outside a step (before next_step(), after commit()) is the program's bug: named. One in
// a step whose generation broke is not: false, as the call that found it broken.
void ElasticLoop::Impl::check_in_step(const char* call) const {
  if (!step_given_)
    throw std::logic_error(std::string("ElasticLoop::") + call +
                           " outside a step: call next_step() first (and once after each "
                           "commit(); a false or empty answer means redo from next_step())");
}

bool ElasticLoop::Impl::allreduce(void* data, size_t count, comm::DataType type) {
  check_in_step("allreduce()");
  if (!in_generation_ || !step_open_) return false;
  try {
    comm_->allreduce(data, data, count, type, comm::ReduceOp::sum);
    return true;
  } catch (const comm::Error& e) {
    broken(e);
    return false;
  }
}

void* ElasticLoop::Impl::shared(size_t count, size_t element_bytes) {
  if (count > (size_t(1) << 62) / element_bytes)
    throw std::runtime_error("shared buffer of " + std::to_string(count) + " elements: too large");
  if (!arena_) {
    std::string why;
    arena_ = comm::SharedArena::create(shared_bytes_, &why);
    if (!arena_) throw std::runtime_error("no shared memory for the loop's buffers: " + why);
  }
  void* p = arena_->allocate(std::max<size_t>(count * element_bytes, 1));
  if (!p)
    throw std::runtime_error(
        "no room for a shared buffer of " + std::to_string(count * element_bytes) +
        " bytes: LoopOptions::shared_bytes = " + std::to_string(shared_bytes_) +
        " and the buffers so far take the rest");
  return p;
}

uint64_t ElasticLoop::Impl::in_place() const {
  return in_place_before_ + (comm_ ? comm_->registered_allreduces() : 0);
}

std::optional<double> ElasticLoop::Impl::commit(double loss) {
  check_in_step("commit()");
  step_given_ = false;  // (the step ends here, committed or not)
  if (!in_generation_ || !step_open_) return std::nullopt;
  auto& board = session_.board();
  double control[2] = {loss, board.stop_requested() || board.leaving(generation_) ? 1.0 : 0.0};
  try {
    comm_->allreduce(control, control, 2, comm::DataType::f64, comm::ReduceOp::sum);
  } catch (const comm::Error& e) {
    broken(e);
    return std::nullopt;
  }
  step_open_ = false;
  if (!std::isfinite(control[0])) return diverged(control[0]);
  applied_ = step_.step + 1;
  stop_voted_ = control[1] > 0;
  const double seconds = std::chrono::duration<double>(Clock::now() - step_start_).count();
  const uint64_t samples = step_.end - step_.begin;
  session_.send(actors::encode(actors::StepReport{generation_, step_.step, rank_, control[0],
                                                  samples, samples, step_.begin, step_.end, seconds,
                                                  seconds, 0, 0, 0, 0, 0, 0}));  // (no FLOPs)
  return control[0];
}

// A step whose loss, summed over the members, is not finite: the job fails (as a built-in model's
// does) and the step is not committed; next_step() then ends with the job.
std::nullopt_t ElasticLoop::Impl::diverged(double loss) {
  const std::string why = "the training diverged at step " + std::to_string(step_.step) +
                          ": its loss, summed over the members, is " +
                          (std::isnan(loss) ? "nan" : "infinite") +
                          " (commit() gave no loss: the update must not be applied)";
  spdlog::error("loop {}: {}", session_.name(), why);
  failed_ = why;
  session_.send(actors::encode(
      actors::WorkerFailed{{session_.agent_id(), 0}, rank_, generation_, why, false, true}));
  in_generation_ = false;
  return std::nullopt;
}

void ElasticLoop::Impl::broken(const comm::Error& e) {
  spdlog::warn("loop {} (rank {}, generation {}): {}; waiting for the next generation",
               session_.name(), rank_, generation_, e.what());
  last_error_ = e.what();
  in_generation_ = step_open_ = false;
  if (comm_) comm_->abort();
  ++want_;
}

bool ElasticLoop::Impl::end_job() {
  try {
    comm_->barrier();  // nobody leaves while another still waits on it
  } catch (const comm::Error&) {
  }
  const std::vector<uint8_t> bytes = state_.save();
  session_.send(actors::encode(
      actors::WorkerDone{rank_, generation_, applied_, comm::fnv1a(bytes.data(), bytes.size())}));
  return session_.board().await_end(generation_);
}

ElasticLoop::ElasticLoop(const LoopOptions& options, LoopState state)
    : impl_(std::make_unique<Impl>(options, std::move(state))) {}
ElasticLoop::~ElasticLoop() = default;
const LoopJob& ElasticLoop::job() const { return impl_->job; }
std::optional<LoopStep> ElasticLoop::next_step() { return impl_->next_step(); }
bool ElasticLoop::allreduce(float* data, size_t count) {
  return impl_->allreduce(data, count, comm::DataType::f32);
}
bool ElasticLoop::allreduce(double* data, size_t count) {
  return impl_->allreduce(data, count, comm::DataType::f64);
}
float* ElasticLoop::shared_floats(size_t count) {
  return static_cast<float*>(impl_->shared(count, sizeof(float)));
}
double* ElasticLoop::shared_doubles(size_t count) {
  return static_cast<double*>(impl_->shared(count, sizeof(double)));
}
uint64_t ElasticLoop::in_place_allreduces() const { return impl_->in_place(); }
std::optional<double> ElasticLoop::commit(double loss) { return impl_->commit(loss); }
std::string ElasticLoop::leave() { return impl_->leave(); }
int ElasticLoop::exit_code() const { return impl_->exit_code; }
std::string ElasticLoop::reason() const { return impl_->reason; }

}  // namespace troupe
