#include "models/devices.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <stdexcept>
#include <vector>

namespace troupe::models {
namespace {

// The module's entry points (models/cuda/plugin.cpp).
using OpenFn = Compute* (*)(int device, int bf16, char* error, size_t error_size);
using CountFn = int (*)();

struct Module {
  OpenFn open = nullptr;
  CountFn count = nullptr;
  std::string error;  // why it did not load ("" when it did)
};

std::string program_dir() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return ".";
  std::string path(self, size_t(n));
  return path.substr(0, path.rfind('/'));
}

// Beside the program (a build tree), or in lib/troupe/ of its prefix (an installed one).
Module load() {
  Module m;
#ifndef TROUPE_CUDA_MODULE
  m.error = "this build has no CUDA device support (nvcc was not found when it was configured)";
  return m;
#else
  const std::string dir = program_dir();
  std::string tried;
  for (const std::string& path :
       {dir + "/" TROUPE_CUDA_MODULE, dir + "/../lib/troupe/" TROUPE_CUDA_MODULE}) {
    if (::access(path.c_str(), R_OK) != 0) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      m.error = std::string("cannot load ") + path + ": " + ::dlerror();
      return m;
    }
    m.open = reinterpret_cast<OpenFn>(::dlsym(h, "troupe_cuda_open"));
    m.count = reinterpret_cast<CountFn>(::dlsym(h, "troupe_cuda_device_count"));
    if (!m.open || !m.count) m.error = path + " is not Troupe's CUDA module (no entry points)";
    return m;
  }
  m.error = "the CUDA module " TROUPE_CUDA_MODULE " is not installed (looked for " + tried + ")";
  return m;
#endif
}

const Module& module() {
  static std::once_flag once;
  static Module m;
  std::call_once(once, [] { m = load(); });
  return m;
}

int index_of(const std::string& device, size_t at) {
  if (device.size() <= at || device.size() - at > 4 ||
      device.find_first_not_of("0123456789", at) != std::string::npos)
    throw std::runtime_error("device '" + device + "' is not cpu:N or cuda:N");
  return std::stoi(device.substr(at));
}

}  // namespace

std::shared_ptr<Compute> open_compute(const std::string& device, bool bf16) {
  if (device == "cpu" || device.rfind("cpu:", 0) == 0) {
    if (device != "cpu") index_of(device, 4);
    return std::shared_ptr<Compute>(bf16 ? &cpu_bf16_compute() : &cpu_compute(), [](Compute*) {});
  }
  if (device.rfind("cuda:", 0) != 0)
    throw std::runtime_error("device '" + device + "' is not cpu:N or cuda:N");
  const int ordinal = index_of(device, 5);
  const Module& m = module();
  if (!m.error.empty()) throw std::runtime_error("device '" + device + "': " + m.error);
  char error[512] = "";
  Compute* c = m.open(ordinal, bf16 ? 1 : 0, error, sizeof error);
  if (!c) throw std::runtime_error("device '" + device + "': " + error);
  return std::shared_ptr<Compute>(c);
}

std::string cuda_workers_unavailable(int* count) {
  const Module& m = module();
  if (!m.error.empty()) return m.error;
  const int n = m.count();
  if (count) *count = n;
  return n > 0 ? "" : "no CUDA device (no driver or no GPU)";
}

}  // namespace troupe::models
