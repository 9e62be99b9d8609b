#include "runtime/tools/doctor.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "comm/mpi_communicator.h"
#include "nn/device.h"
#include "offload/pinned_pool.h"
#include "runtime/tools/launch.h"
#include "runtime/tools/plan.h"

namespace ferry::runtime {

namespace fs = std::filesystem;

namespace {

DoctorCheck make(DoctorCheck::Status s, std::string name, std::string detail, std::string fix = "") {
  DoctorCheck c;
  c.status = s;
  c.name = std::move(name);
  c.detail = std::move(detail);
  c.fix = std::move(fix);
  return c;
}

std::string bytes(unsigned long long b) { return nn::format_bytes(static_cast<size_t>(b)); }

}  // namespace

std::pair<int, std::string> run_command(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 512> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p)) out += buf.data();
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0), out};
}

namespace {

DoctorCheck check_mpi(const DoctorOptions& o) {
  if (o.self.empty()) return make(DoctorCheck::warn, "mpi", "not checked (no program path to run as ranks)");
  const std::string cmd = "timeout " + std::to_string(static_cast<int>(o.mpi_timeout_s)) + " " + shell_quote(o.mpiexec) +
                          " -n 2 " + shell_quote(o.self) + " doctor --mpi-probe";
  const auto [status, out] = run_command(cmd);
  if (status == 0 && out.find("mpi probe: 2 ranks, sum 3") != std::string::npos) {
    return make(DoctorCheck::ok, "mpi", "2-rank all-reduce through " + o.mpiexec + " returned the right sum");
  }
  std::string tail = out.size() > 400 ? out.substr(out.size() - 400) : out;
  while (!tail.empty() && tail.back() == '\n') tail.pop_back();
  return make(DoctorCheck::fail, "mpi",
              (status == 124 ? "the 2-rank probe hung for " + std::to_string(static_cast<int>(o.mpi_timeout_s)) + " s"
                             : "the 2-rank probe failed (exit " + std::to_string(status) + ")") +
                  (tail.empty() ? "" : ": " + tail),
              "install MPICH (apt-get install mpich libmpich-dev) and check that `" + o.mpiexec +
                  " -n 2 hostname` runs; on several nodes, passwordless ssh between them");
}

DoctorCheck check_io_uring() {
  io_uring ring{};
  const int rc = io_uring_queue_init(8, &ring, 0);
  if (rc == 0) {
    io_uring_queue_exit(&ring);
    return make(DoctorCheck::ok, "io_uring", "a ring can be created: nvme offload uses io_uring");
  }
  return make(DoctorCheck::warn, "io_uring", std::string("io_uring_queue_init: ") + std::strerror(-rc) +
                                                  ": nvme offload falls back to pread/pwrite (slower)",
              "a kernel >= 5.6 with io_uring enabled (sysctl kernel.io_uring_disabled=0; containers: a seccomp "
              "profile that allows io_uring_setup)");
}

unsigned long long mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  unsigned long long kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

template <class F>
F load(void* h, const char* name) {
  return h ? reinterpret_cast<F>(dlsym(h, name)) : nullptr;
}

DoctorCheck check_cuda(bool needed) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  const auto init = load<int (*)(unsigned)>(h, "cuInit");
  const auto count = load<int (*)(int*)>(h, "cuDeviceGetCount");
  const auto version = load<int (*)(int*)>(h, "cuDriverGetVersion");
  int n = 0, v = 0;
  if (!init || !count || !version) {
    if (h) dlclose(h);
    return make(needed ? DoctorCheck::fail : DoctorCheck::ok, "cuda",
                "no CUDA driver (libcuda.so.1): CPU device only", needed ? "install the NVIDIA driver" : "");
  }
  const int rc = init(0);
  if (rc == 0) count(&n), version(&v);
  // No dlclose: once cuInit has run the driver has threads and exit work of its own, and
  // unloading it under them is known to crash at exit on some drivers (review Q6). The
  // handle is left open for the life of the process.
  const std::string d = "driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) + ", " +
                        std::to_string(n) + " GPU(s)" + (rc != 0 ? " (cuInit failed: " + std::to_string(rc) + ")" : "");
  return make(n > 0 || !needed ? DoctorCheck::ok : DoctorCheck::fail, "cuda", d);
}

DoctorCheck check_nccl() {
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  const auto get = load<int (*)(int*)>(h, "ncclGetVersion");
  int v = 0;
  if (!get || get(&v) != 0) {
    if (h) dlclose(h);
    return make(DoctorCheck::ok, "nccl", "no libnccl.so.2: GPU collectives unavailable (MPI is used on CPU runs)");
  }
  dlclose(h);
  return make(DoctorCheck::ok, "nccl",
              "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100));
}

}  // namespace

std::string o_direct_round_trip(const std::string& dir) {
  const std::string path = (fs::path(dir) / (".ferry-doctor-" + std::to_string(::getpid()))).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0) return std::string("open(O_DIRECT): ") + std::strerror(errno);
  void* buf = std::aligned_alloc(4096, 8192);
  auto* out = static_cast<unsigned char*>(buf);
  auto* in = out + 4096;
  for (int i = 0; i < 4096; ++i) out[i] = static_cast<unsigned char>(i * 31 + 7);
  std::string problem;
  if (::pwrite(fd, out, 4096, 0) != 4096) {
    problem = std::string("O_DIRECT write: ") + std::strerror(errno);
  } else if (::pread(fd, in, 4096, 0) != 4096) {
    problem = std::string("O_DIRECT read: ") + std::strerror(errno);
  } else if (std::memcmp(out, in, 4096) != 0) {
    problem = "O_DIRECT read returned other bytes than were written";
  }
  std::free(buf);
  ::close(fd);
  ::unlink(path.c_str());
  return problem;
}

std::string folder_to_create(const std::string& dir, std::string& ancestor) {
  ancestor.clear();
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return "cannot make the path absolute: " + ec.message();
  if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();  // "/a/b/" is "/a/b"
  // The nearest entry that exists, a dangling link included (create_directories cannot
  // make a folder where a link points nowhere).
  fs::path at = p;
  while (fs::symlink_status(at, ec).type() == fs::file_type::not_found && at.has_relative_path()) at = at.parent_path();
  const fs::file_status st = fs::status(at, ec);
  if (at == p) return "exists and is not a folder";
  if (st.type() == fs::file_type::not_found) return at.string() + " is a link to a missing target";
  if (st.type() != fs::file_type::directory) return at.string() + " is not a folder";
  if (::access(at.c_str(), W_OK | X_OK) != 0) {
    return "cannot create folders in " + at.string() + ": " + std::strerror(errno);
  }
  ancestor = at.string();
  return "";
}

DoctorCheck check_space(const std::string& dir, unsigned long long needed, unsigned long long available) {
  if (available >= needed) {
    return make(DoctorCheck::ok, "nvme space", dir + ": " + bytes(available) + " free, " + bytes(needed) + " needed");
  }
  return make(DoctorCheck::fail, "nvme space", dir + ": " + bytes(available) + " free but the offloaded state needs " +
                                                   bytes(needed),
              "free space there, list more folders (comma-separated nvme_path stripes over them), or offload less");
}

std::vector<DoctorCheck> run_doctor(const DoctorOptions& o) {
  std::vector<DoctorCheck> out;
  out.push_back(check_mpi(o));
  out.push_back(check_io_uring());
  const Config* c = o.config;
  const auto ranks = static_cast<unsigned long long>(std::max(1, o.ranks_per_node));
  MemoryPlan plan;
  if (c) plan = plan_memory(*c, c->world_size);
  // nvme folders: usable, O_DIRECT, space for every rank's files on this node.
  if (c) {
    // Each store is striped evenly over its folders; a folder may serve both.
    std::map<std::string, unsigned long long> dirs;
    const bool opt = c->zero.stage >= 1 && c->offload.optimizer_device == offload::Tier::nvme;
    const bool par = c->zero.stage == 3 && c->offload.param_device == offload::Tier::nvme;
    if (opt) {
      for (const std::string& d : c->offload.optimizer_paths)
        dirs[d] += (plan.nvme - plan.nvme_params) * ranks / c->offload.optimizer_paths.size();
    }
    if (par) {
      for (const std::string& d : c->offload.param_paths) dirs[d] += plan.nvme_params * ranks / c->offload.param_paths.size();
    }
    for (const auto& [d, share] : dirs) {
      std::error_code ec;
      // A missing folder is made by `ferry train` (create_nvme_folders, as DeepSpeed does):
      // it is a problem only where it cannot be made. Its file system is its nearest
      // existing ancestor's, where the O_DIRECT and space checks then run. Nothing is
      // created here.
      std::string at = d, label = d;
      if (!fs::is_directory(d, ec)) {
        std::string origin;
        for (const auto& [folder, from] : c->nvme_folders)
          if (folder == d) origin = from;
        const std::string problem = folder_to_create(d, at);
        if (!problem.empty()) {
          out.push_back(make(DoctorCheck::fail, "nvme",
                             d + ": cannot be created: " + problem + (origin.empty() ? "" : " (set by " + origin + ")"),
                             "set nvme_path to a folder that exists or can be created, on every node"));
          continue;
        }
        out.push_back(make(DoctorCheck::ok, "nvme", d + ": does not exist yet: will be created by ferry train (under " +
                                                        at + ", writable)"));
        label = d + " (on " + at + ")";
      }
      const std::string problem = o_direct_round_trip(at);
      if (problem.rfind("open(O_DIRECT): Invalid argument", 0) == 0) {
        out.push_back(make(DoctorCheck::warn, "nvme", label + ": the file system refuses O_DIRECT (tmpfs, some overlays): "
                                                              "ferry uses buffered I/O there (the page cache takes memory)",
                           "put nvme_path on a local NVMe file system (ext4, xfs)"));
      } else if (!problem.empty()) {
        out.push_back(make(DoctorCheck::fail, "nvme", label + ": " + problem, "check the folder's permissions and device"));
      } else {
        out.push_back(make(DoctorCheck::ok, "nvme", label + ": O_DIRECT 4 KiB write and read round-trip"));
      }
      struct statvfs sv {};
      if (::statvfs(at.c_str(), &sv) == 0) {
        out.push_back(check_space(label, share, static_cast<unsigned long long>(sv.f_bavail) * sv.f_frsize));
      }
    }
    // Pinning.
    if (plan.host_pinned > 0) {
      struct rlimit rl {};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      const size_t limit = rl.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(rl.rlim_cur);
      const bool pin = c->offload.optimizer_pin && c->offload.param_pin;
      const std::string problem = pin ? offload::memlock_problem(plan.host_pinned, limit, offload::may_exceed_memlock()) : "";
      if (!pin) {
        out.push_back(make(DoctorCheck::warn, "memlock", "pin_memory is false: the staging pool is not page-locked"));
      } else if (problem.empty()) {
        out.push_back(make(DoctorCheck::ok, "memlock", "the " + bytes(plan.host_pinned) + " pinned pool per rank is allowed (" +
                                                           (limit == SIZE_MAX ? std::string("unlimited") : bytes(limit)) +
                                                           (offload::may_exceed_memlock() ? ", or privileged" : "") + ")"));
      } else {
        out.push_back(make(DoctorCheck::fail, "memlock", problem.substr(0, problem.find(". Raise")),
                           problem.substr(problem.find("Raise"))));
      }
    }
    // Host memory: every rank on this node; the CPU device's arena is host memory too.
    const unsigned long long per_rank =
        plan.host_states + plan.host_pinned + (c->device.type == "cpu" ? plan.device_peak : 0);
    const unsigned long long need = per_rank * ranks, avail = mem_available();
    if (avail == 0) {
      out.push_back(make(DoctorCheck::warn, "memory", "cannot read MemAvailable from /proc/meminfo"));
    } else if (need <= avail) {
      out.push_back(make(DoctorCheck::ok, "memory", bytes(avail) + " available, " + bytes(need) + " needed by " +
                                                        std::to_string(ranks) + " rank(s) (ferry plan's figures)"));
    } else {
      out.push_back(make(DoctorCheck::fail, "memory",
                         bytes(avail) + " available but " + std::to_string(ranks) + " rank(s) need " + bytes(need),
                         "offload more to nvme (see ferry plan), fewer ranks per node, or a smaller micro-batch"));
    }
  }
  out.push_back(check_cuda(c && c->device.type == "cuda"));
  out.push_back(check_nccl());
  return out;
}

std::string format_checks(const std::vector<DoctorCheck>& checks) {
  std::ostringstream os;
  int failed = 0, warned = 0;
  for (const DoctorCheck& c : checks) {
    os << (c.status == DoctorCheck::ok ? "[ ok ] " : c.status == DoctorCheck::warn ? "[warn] " : "[FAIL] ") << c.name
       << ": " << c.detail << "\n";
    if (!c.fix.empty() && c.status != DoctorCheck::ok) os << "       fix: " << c.fix << "\n";
    failed += c.status == DoctorCheck::fail;
    warned += c.status == DoctorCheck::warn;
  }
  os << (failed ? std::to_string(failed) + " problem(s) would stop a run" : std::string("nothing would stop a run"))
     << (warned ? ", " + std::to_string(warned) + " warning(s)" : std::string()) << "\n";
  return os.str();
}

int mpi_probe_main() {
  auto comm = comm::MpiCommunicator::world(/*timeout_s=*/30);
  std::vector<double> v{static_cast<double>(comm->rank() + 1)};
  comm->all_reduce_sum(v);
  const int n = comm->size();
  const bool right = v[0] == n * (n + 1) / 2.0;
  if (comm->rank() == 0) std::cout << "mpi probe: " << n << " ranks, sum " << v[0] << "\n";
  return right ? 0 : 1;
}

}  // namespace ferry::runtime
