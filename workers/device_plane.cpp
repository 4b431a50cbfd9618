#include "workers/device_plane.h"

#include <sched.h>

#include <cstring>
#include <vector>

#include "comm/nccl_communicator.h"
#include "workers/faults.h"

namespace troupe::workers {
namespace {

using Clock = std::chrono::steady_clock;

// A member's device identity on the wire: a fixed-size text field (allgather needs equal sizes).
struct DeviceRecord {
  char device[128];
};
static_assert(sizeof(DeviceRecord) % sizeof(int64_t) == 0);

void put(char* field, size_t size, const std::string& s, const char* what) {
  if (s.size() >= size)
    TROUPE_FAIL(comm::Errc::invalid_input,
                std::string(what) + " is longer than " + std::to_string(size - 1) + " bytes: " + s);
  std::memset(field, 0, size);
  std::memcpy(field, s.data(), s.size());
}

std::string get(const char* field, size_t size) { return std::string(field, strnlen(field, size)); }

std::vector<elastic::MemberDevice> gather_devices(comm::Communicator& host,
                                                  const std::string& device) {
  DeviceRecord mine;
  put(mine.device, sizeof mine.device, device, "the device identity");
  std::vector<DeviceRecord> all(size_t(host.size()));
  host.allgather(&mine, all.data(), sizeof(DeviceRecord) / sizeof(int64_t), comm::DataType::i64);
  std::vector<elastic::MemberDevice> members;
  for (const DeviceRecord& r : all) members.push_back({get(r.device, sizeof r.device)});
  return members;
}

// Rank 0's NCCL unique id, on every member.
std::string share_unique_id(comm::Communicator& host) {
  char id[256] = {};  // 256 hex digits (no terminator)
  if (host.rank() == 0) {
    const std::string mine = comm::nccl_unique_id();
    TROUPE_ENFORCE(mine.size() == sizeof id, "an NCCL unique id has 256 hex digits");
    std::memcpy(id, mine.data(), sizeof id);
  }
  host.broadcast(id, sizeof id / sizeof(int64_t), comm::DataType::i64, 0);
  return std::string(id, sizeof id);
}

}  // namespace

std::unique_ptr<comm::Communicator> FaultInjector::device_link(models::Compute&,
                                                               comm::Communicator&,
                                                               std::function<bool()>) {
  return nullptr;
}

std::unique_ptr<DevicePlane> DevicePlane::form(comm::Communicator& host, models::Compute& compute,
                                               const PlaneOptions& o) {
  const std::string device = compute.device() == models::Device::cpu ? "" : compute.identity();
  elastic::PlaneChoice choice = elastic::choose_data_plane(o.backend, gather_devices(host, device));
  if (choice.refused) throw PlaneRefused(choice.why);
  if (choice.plane == elastic::DataPlane::host_staged)
    return std::unique_ptr<DevicePlane>(new DevicePlane(std::move(choice), nullptr));
  std::unique_ptr<comm::Communicator> link = o.link ? o.link(host) : nullptr;
  if (link) {
    choice.why += " (a test's stand-in for NCCL)";
  } else {
    comm::NcclOptions nccl;
    nccl.timeout = o.timeout;
    nccl.device = o.cuda_device;
    nccl.abandoned = o.abandoned;
    link = comm::make_nccl_communicator(host.generation(), host.rank(), host.size(),
                                        share_unique_id(host), nccl);
  }
  return std::unique_ptr<DevicePlane>(new DevicePlane(std::move(choice), std::move(link)));
}

void await_fence(models::Compute::Fence& fence, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!fence.reached()) {
    if (Clock::now() > deadline)
      TROUPE_FAIL(comm::Errc::timed_out, "the device did not finish a gradient within " +
                                             std::to_string(timeout.count()) + " ms");
    sched_yield();
  }
}

}  // namespace troupe::workers
