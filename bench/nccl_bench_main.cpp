// troupe_nccl_bench: the NCCL allreduce benchmark as a small binary for scripts/gpu-check.sh
// (no CAF, no OpenBLAS: little to carry to a GPU machine).
// Usage: troupe_nccl_bench [--json] [--sizes 4K,1M,64M,256M]
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"

int main(int argc, char** argv) {
  bool json = false;
  std::string list = "4096,65536,1048576,16777216,67108864,268435456";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--sizes" && i + 1 < argc)
      list = argv[++i];
    else {
      std::fprintf(stderr, "usage: troupe_nccl_bench [--json] [--sizes BYTES,BYTES,...]\n");
      return 2;
    }
  }
  std::vector<size_t> sizes;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) sizes.push_back(std::stoull(item));
  try {
    return troupe::bench::run_nccl_allreduce_bench(sizes, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe_nccl_bench: %s\n", e.what());
    return 1;
  }
}
