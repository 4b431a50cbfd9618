// One device's worker under supervision, on the device's own thread. For each generation it
// follows the same explicit steps:
//
//   publish   a fresh data-plane address, with what the worker holds (WorkerReady)
//   await     the coordinator's member list for that generation (GenerationBoard)
//   connect   the generation's communicator (a standby, not in the list, publishes again)
//   take      the state it lacks (elastic::plan_migration, executed by the worker)
//   train     until the job ends, a stop, or the generation is left at a step boundary
//   report    WorkerDone (the job ended for it), or on to the next generation
//
// A data-plane error ends the generation (the next one is published for, with the error). A
// worker that throws anything else is reported (its communicator aborted first, so the other
// members hear at once) and built afresh, at most elastic.worker_max_restarts times within
// elastic.worker_restart_window_ms (actors::RestartIntensity); past that, or when the model's
// state is lost (StateLost), it is reported as given up and the supervisor ends.
//
// Thread-safety: run() on one thread; it shares only the board and `send` with its agent.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "actors/job_protocol.h"
#include "actors/restart_intensity.h"
#include "comm/ucx_communicator.h"
#include "workers/device_plane.h"
#include "workers/generation_board.h"
#include "workers/worker.h"

namespace troupe::workers {

// What the device supervisors of one agent share.
struct DeviceContext {
  WorkerSpec spec;  // the job's (device fields are set per device)
  // The agent's id (a new one when it rejoins a coordinator after losing its own).
  std::function<uint32_t()> agent_id;
  uint64_t first_generation = 1;
  GenerationBoard* board = nullptr;
  std::function<void(actors::ControlMessage)> send;  // to the coordinator, one way
  int max_restarts = 3;
  std::chrono::milliseconds restart_window{60000};
};

class DeviceSupervisor {
 public:
  DeviceSupervisor(const DeviceContext& context, uint32_t device, const std::string& name);
  // Until the agent shuts down, the job ends for this worker, or the supervisor gives up.
  void run();

 private:
  enum class Next { generation, done };
  Next run_generation();
  void publish();
  bool connect(const actors::GenerationStart& g);  // false: not a member (a standby)
  void form_device_plane(uint64_t generation);
  void take_state(const actors::GenerationStart& g);
  Next train(const actors::GenerationStart& g);
  // A finished checkpoint write of this worker's blocks, to the coordinator.
  void report_checkpoint(uint64_t gen, uint32_t rank, const CheckpointWriter::Written& w);
  bool restart_after(const std::exception& e);  // true: the worker is built again

  const DeviceContext& ctx_;
  GenerationBoard& board_;
  actors::WorkerId id_;
  WorkerSpec spec_;
  actors::RestartIntensity intensity_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<comm::UcxCommunicator> comm_;
  std::unique_ptr<DevicePlane> plane_;  // this generation's (it goes before comm_)
  std::string exact_plane_;  // parallel.deterministic's data plane, said as a DevicePlane's is
  uint64_t want_;            // the generation it publishes for next
  uint64_t rejoins_ = 0;     // the agent's rejoins when it last published
  std::string last_error_;   // why the previous generation ended for it, if the data plane broke
  int rank_ = -1;
  uint64_t generation_ = 0;
};

// The worker spec of the job a JobSpec describes (the device fields are the caller's).
WorkerSpec worker_spec_of(const actors::JobSpec& spec);

}  // namespace troupe::workers
