#include "comm/gpu_binding.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ferry::comm {

GpuChoice choose_gpu(int gpus, int local_rank, int local_size) {
  GpuChoice c;
  if (gpus >= local_size && local_rank < gpus) {
    c.ordinal = local_rank;
  } else if (gpus == 1) {
    c.ordinal = 0;  // the launcher gave this rank its own GPU
  } else {
    c.problem = std::to_string(local_size) + " ranks on this node but " + std::to_string(gpus) +
                " GPU(s) visible to each: one GPU per rank, either every GPU visible to every rank "
                "(rank i takes GPU i) or exactly one per rank (CUDA_VISIBLE_DEVICES per rank)";
  }
  return c;
}

namespace {

// Fixed-size records, so one all-gather of bytes carries them.
struct Record {
  char host[96];
  char bus[32];
};

void put(char* dst, size_t n, const std::string& s) {
  std::memset(dst, 0, n);
  std::memcpy(dst, s.data(), std::min(n - 1, s.size()));
}

}  // namespace

std::string shared_gpu_problem(Communicator& comm, const std::string& bus_id) {
  Record mine{};
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  put(mine.host, sizeof mine.host, host);
  put(mine.bus, sizeof mine.bus, bus_id);
  std::vector<Record> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof(Record), DataType::u8)->wait();
  for (size_t a = 0; a < all.size(); ++a) {
    for (size_t b = a + 1; b < all.size(); ++b) {
      if (std::strncmp(all[a].host, all[b].host, sizeof(Record::host)) != 0 ||
          std::strncmp(all[a].bus, all[b].bus, sizeof(Record::bus)) != 0) {
        continue;
      }
      return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " on " + all[a].host +
             " both use the GPU at PCI bus id " + all[a].bus +
             ": give each rank its own GPU (check CUDA_VISIBLE_DEVICES and the launcher's GPU binding)";
    }
  }
  return "";
}

}  // namespace ferry::comm
