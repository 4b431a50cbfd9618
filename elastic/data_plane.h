// Which data plane carries a generation's gradients and state, as a pure function of the
// backend asked for and the members' devices (workers/device_plane.h acts on it):
//   host_staged  over UCX and shared memory, every tensor through host memory (any devices);
//   device       NCCL over the members' device memory, no host copy: every member on a GPU of
//                its own (NCCL refuses two ranks on one device).
// `parallel.backend`: "ucx" always host-staged; "nccl" the device plane or refused (never a
// silent fallback); "auto" the device plane where it can serve the members, else host-staged,
// saying why.
#pragma once

#include <string>
#include <vector>

namespace troupe::elastic {

// What a member computes on, as every member sees it: the device's identity, unique across
// hosts ("GPU-<uuid>": two containers of one host that see the same GPU share it); empty: the CPU.
struct MemberDevice {
  std::string device;
  bool gpu() const { return !device.empty(); }
};

enum class DataPlane { host_staged, device };

struct PlaneChoice {
  DataPlane plane = DataPlane::host_staged;
  bool refused = false;  // backend "nccl" and the members cannot use it: why says so
  std::string why;       // for the log: "every member on its own GPU", "ranks 0 and 1 share ..."
};

// `members` by rank; `backend` is "auto", "ucx" or "nccl" ("" reads as "auto").
PlaneChoice choose_data_plane(const std::string& backend, const std::vector<MemberDevice>& members);

}  // namespace troupe::elastic
