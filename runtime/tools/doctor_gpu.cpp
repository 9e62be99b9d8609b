#include "runtime/tools/doctor_gpu.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "base/env.h"
#include "comm/mpi_communicator.h"
#include "nn/device.h"
#include "runtime/tools/launch.h"

namespace ferry::runtime {

bool is_cuda_library(const std::string& base) {
  if (base.rfind("lib", 0) != 0) return false;
  const std::string n = base.substr(3);
  for (const char* p : {"cuda", "cublas", "cudnn", "cufft", "curand", "cusparse", "cusolver", "cupti", "nvrtc",
                        "nvJitLink", "nvToolsExt", "nvidia", "nccl"}) {
    if (n.rfind(p, 0) == 0) return true;
  }
  return n.find("_cuda") != std::string::npos || n.find("-cuda") != std::string::npos;
}

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

// The driver API, as far as the doctor uses it (CUresult is an int, CUdevice an int,
// CUcontext a pointer; the attribute numbers are cuda.h's).
constexpr int kAttrCcMajor = 75, kAttrCcMinor = 76, kAttrSharedOptin = 97;
struct Driver {
  int (*init)(unsigned) = nullptr;
  int (*version)(int*) = nullptr;
  int (*count)(int*) = nullptr;
  int (*get)(int*, int) = nullptr;
  int (*name)(char*, int, int) = nullptr;
  int (*attribute)(int*, int, int) = nullptr;
  int (*retain)(void**, int) = nullptr;
  int (*release)(int) = nullptr;
  int (*set_current)(void*) = nullptr;
  int (*mem_info)(size_t*, size_t*) = nullptr;
  int (*ctx_state)(int, unsigned*, int*) = nullptr;
  int (*error_name)(int, const char**) = nullptr;
  bool complete() const {
    return init && version && count && get && name && attribute && retain && release && set_current && mem_info &&
           ctx_state;
  }
  std::string error(int rc) const {
    const char* s = nullptr;
    if (error_name && error_name(rc, &s) == 0 && s) return std::string(s) + " (" + std::to_string(rc) + ")";
    return "CUresult " + std::to_string(rc);
  }
};

template <class F>
void bind(void* h, F& f, const char* name, const char* fallback = nullptr) {
  void* p = dlsym(h, name);
  if (!p && fallback) p = dlsym(h, fallback);
  f = reinterpret_cast<F>(p);
}

// The driver library stays loaded for the life of the process: once cuInit has run, the
// driver has threads and atexit work of its own, and unloading it under them is known
// to crash at exit on some drivers (review Q6). So the handle is kept, never dlclosed.
// Returns null when the library cannot be loaded.
const Driver* load_driver(const std::string& lib) {
  static std::map<std::string, Driver> loaded;
  if (auto it = loaded.find(lib); it != loaded.end()) return it->second.init ? &it->second : nullptr;
  Driver& d = loaded[lib];
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return nullptr;
  bind(h, d.init, "cuInit");
  bind(h, d.version, "cuDriverGetVersion");
  bind(h, d.count, "cuDeviceGetCount");
  bind(h, d.get, "cuDeviceGet");
  bind(h, d.name, "cuDeviceGetName");
  bind(h, d.attribute, "cuDeviceGetAttribute");
  bind(h, d.retain, "cuDevicePrimaryCtxRetain");
  bind(h, d.release, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
  bind(h, d.set_current, "cuCtxSetCurrent");
  bind(h, d.mem_info, "cuMemGetInfo_v2", "cuMemGetInfo");
  bind(h, d.ctx_state, "cuDevicePrimaryCtxGetState");
  bind(h, d.error_name, "cuGetErrorName");
  if (!d.complete()) d.init = nullptr;  // an old driver: treated as none (the handle stays open)
  return d.init ? &d : nullptr;
}

std::string visible_devices() {
  const char* v = env_value("CUDA_VISIBLE_DEVICES");
  return v ? std::string("CUDA_VISIBLE_DEVICES=") + (*v ? v : "\"\"") : "CUDA_VISIBLE_DEVICES unset";
}

// One line per GPU: what it is, its memory as this process sees it after creating its own
// (primary) context, and the head sizes attention's shared memory allows.
DoctorCheck describe_gpu(const Driver& d, int ordinal) {
  const std::string name = "gpu " + std::to_string(ordinal);
  int dev = 0, major = 0, minor = 0, optin = 0;
  std::array<char, 256> label{};
  int rc = d.get(&dev, ordinal);
  if (rc == 0) rc = d.name(label.data(), static_cast<int>(label.size()), dev);
  if (rc == 0) rc = d.attribute(&major, kAttrCcMajor, dev);
  if (rc == 0) rc = d.attribute(&minor, kAttrCcMinor, dev);
  if (rc == 0) rc = d.attribute(&optin, kAttrSharedOptin, dev);
  if (rc != 0) return make(DoctorCheck::fail, name, "cannot query it: " + d.error(rc), "nvidia-smi; check the driver");
  void* ctx = nullptr;
  size_t free = 0, total = 0;
  rc = d.retain(&ctx, dev);
  if (rc == 0) {
    rc = d.set_current(ctx);
    if (rc == 0) rc = d.mem_info(&free, &total);
    d.set_current(nullptr);
    d.release(dev);
  }
  std::ostringstream os;
  os << label.data() << ", compute capability " << major << "." << minor << ", ";
  if (rc != 0) {
    os << "memory unreadable (" << d.error(rc) << ")";
  } else {
    os << bytes(free) << " free of " << bytes(total);
  }
  os << "; opt-in shared memory per block " << optin << " bytes: attention takes head sizes up to "
     << attention_max_head(optin, 4) << " at any sequence length (f32 accumulation); "
     << tensor_core_attention_line(major);
  if (rc != 0) return make(DoctorCheck::fail, name, os.str(), "another process may hold the GPU (nvidia-smi)");
  // This process's own context takes well under 1 GiB; more in use is someone else's.
  const bool busy = total - free > (3ull << 29);
  if (busy) {
    return make(DoctorCheck::warn, name, os.str() + "; " + bytes(total - free) + " in use",
                "other processes hold memory on it (nvidia-smi): set device.memory below the free figure");
  }
  return make(DoctorCheck::ok, name, os.str());
}

DoctorCheck check_nccl_version() {
  // libnccl has no driver-like exit work, but it is small: kept loaded as well.
  static void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  const auto get = h ? reinterpret_cast<int (*)(int*)>(dlsym(h, "ncclGetVersion")) : nullptr;
  int v = 0;
  if (!get || get(&v) != 0)
    return make(DoctorCheck::fail, "nccl", "no libnccl.so.2: multi-rank GPU runs cannot start",
                "install NCCL (libnccl2) or put its lib folder on LD_LIBRARY_PATH");
  return make(DoctorCheck::ok, "nccl",
              "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100));
}

std::set<std::string> mapped_cuda_libraries() {
  std::set<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = path.substr(path.rfind('/') + 1);
    if (is_cuda_library(base)) out.insert(base);
  }
  return out;
}

std::string context_states(const Driver& d, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    int dev = 0, active = 0;
    unsigned flags = 0;
    if (d.get(&dev, i) == 0) d.ctx_state(dev, &flags, &active);
    if (i) s += ',';
    s += active ? '1' : '0';
  }
  return s;
}

DoctorCheck check_mpi_cuda(const GpuDoctorOptions& o) {
  const char* enable = env_value("MPIR_CVAR_ENABLE_GPU");
  if (o.self.empty()) return make(DoctorCheck::warn, "mpi+cuda", "not checked (no program path to run as a rank)");
  const std::string cmd = "timeout " + std::to_string(static_cast<int>(o.mpi_timeout_s)) + " " + shell_quote(o.mpiexec) +
                          " -n 1 " + shell_quote(o.self) + " doctor --gpu-mpi-probe";
  const auto [status, out] = run_command(cmd);
  return mpi_cuda_verdict(status, out, enable);
}

}  // namespace

DoctorCheck check_tf32(const char* value) {
  if (!value || !*value) {
    return make(DoctorCheck::ok, "tf32", "NVIDIA_TF32_OVERRIDE unset: fp32 GEMMs run in fp32 (CUBLAS_DEFAULT_MATH, "
                                         "CUBLAS_COMPUTE_32F; no TF32)");
  }
  const std::string v = value;
  if (v == "0") return make(DoctorCheck::ok, "tf32", "NVIDIA_TF32_OVERRIDE=0: TF32 off in every NVIDIA library");
  return make(DoctorCheck::warn, "tf32",
              "NVIDIA_TF32_OVERRIDE=" + v +
                  ": a site setting that may let cuBLAS run fp32 GEMMs in TF32 (10-bit mantissa): fp32 results "
                  "change and the 1e-5 tests (test_backend_ops, test_cuda_training) may fail",
              "unset it (or set 0) for the tests and for fp32 runs that must match the CPU device");
}

std::string tensor_core_attention_line(int major) {
  return major >= 8 ? "bf16/f16 attention on tensor cores (device.attention_kernel auto: the mma.sync kernels at "
                      "head sizes 64 and 128, the wmma kernels at other heads up to 128)"
                    : "attention on the SIMT kernels only (tensor cores, wmma and mma alike, need compute capability 8.0)";
}

long attention_max_head(long optin_bytes, int accumulator_bytes) {
  const long elements = optin_bytes / accumulator_bytes;
  return elements < 1088 + 96 ? 0 : std::min(256L, (elements - 1088) / 96);
}

DoctorCheck mpi_cuda_verdict(int status, const std::string& probe_output, const char* enable_gpu) {
  const std::string cvar =
      enable_gpu ? std::string(" (MPIR_CVAR_ENABLE_GPU=") + enable_gpu + ")" : std::string(" (MPIR_CVAR_ENABLE_GPU unset)");
  // "gpu mpi probe: contexts before 0,1 after 1,1; new libraries NAMES" (parsed by hand:
  // <regex> trips GCC 12's -Wmaybe-uninitialized in the sanitizer build).
  std::string before, after, libs;
  const auto parse = [&] {
    const std::string lead = "gpu mpi probe: contexts before ", mid = " after ", tail = "; new libraries ";
    const size_t a = probe_output.find(lead);
    if (a == std::string::npos) return false;
    const size_t b = probe_output.find(mid, a + lead.size());
    const size_t c = b == std::string::npos ? b : probe_output.find(tail, b + mid.size());
    if (c == std::string::npos) return false;
    before = probe_output.substr(a + lead.size(), b - a - lead.size());
    after = probe_output.substr(b + mid.size(), c - b - mid.size());
    const size_t end = probe_output.find('\n', c + tail.size());
    libs = probe_output.substr(c + tail.size(), end == std::string::npos ? std::string::npos : end - c - tail.size());
    const auto flags = [](const std::string& f) { return f.find_first_not_of("01,") == std::string::npos; };
    return flags(before) && flags(after);
  };
  if (status != 0 || !parse()) {
    std::string tail = probe_output.size() > 300 ? probe_output.substr(probe_output.size() - 300) : probe_output;
    while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    return make(DoctorCheck::warn, "mpi+cuda",
                "the 1-rank probe did not answer (exit " + std::to_string(status) + ")" + (tail.empty() ? "" : ": " + tail),
                "run `mpiexec -n 1 ferry doctor --gpu-mpi-probe` by hand and read its error");
  }
  std::string created;
  for (size_t i = 0; i < after.size(); i += 2) {
    if (after[i] == '1' && (i >= before.size() || before[i] == '0')) {
      if (!created.empty()) created += ',';
      created += std::to_string(i / 2);
    }
  }
  if (!created.empty()) {
    return make(DoctorCheck::warn, "mpi+cuda",
                "MPI_Init created a CUDA context on GPU " + created + " (new libraries: " + libs +
                    "): every rank pays that context's memory there before it picks its own GPU" + cvar,
                "export MPIR_CVAR_ENABLE_GPU=0 for ferry runs (ferry gives MPI host buffers only; NCCL moves device "
                "buffers)");
  }
  if (libs != "none") {
    return make(DoctorCheck::ok, "mpi+cuda",
                "MPI_Init created no CUDA context but loaded " + libs + " (an MPI built with GPU support)" + cvar);
  }
  return make(DoctorCheck::ok, "mpi+cuda", "MPI_Init created no CUDA context and loaded no CUDA library" + cvar);
}

std::vector<DoctorCheck> run_gpu_doctor(const GpuDoctorOptions& o) {
  const Driver* d = load_driver(o.libcuda);
  if (!d) {
    return {make(DoctorCheck::fail, "gpu", "no GPU: no CUDA driver (" + o.libcuda + " cannot be loaded)",
                 "on a GPU machine: install the NVIDIA driver")};
  }
  int v = 0, n = 0;
  d->version(&v);
  const std::string driver = "driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  const int rc = d->init(0);
  if (rc != 0) {
    return {make(DoctorCheck::fail, "gpu", "no GPU: cuInit failed: " + d->error(rc) + " (" + driver + ", " +
                                               visible_devices() + ")",
                 "nvidia-smi; CUDA_VISIBLE_DEVICES; the driver must be at least the toolkit's version")};
  }
  d->count(&n);
  if (n == 0) {
    return {make(DoctorCheck::fail, "gpu", "no GPU: the driver sees 0 devices (" + driver + ", " + visible_devices() + ")",
                 "nvidia-smi; CUDA_VISIBLE_DEVICES")};
  }
  std::vector<DoctorCheck> out;
  out.push_back(make(DoctorCheck::ok, "gpu", driver + ", " + std::to_string(n) + " GPU(s) visible (" + visible_devices() + ")"));
  for (int i = 0; i < n; ++i) out.push_back(describe_gpu(*d, i));
  out.push_back(check_tf32(env_value("NVIDIA_TF32_OVERRIDE")));
  out.push_back(check_mpi_cuda(o));
  out.push_back(check_nccl_version());
  return out;
}

bool found_no_gpu(const std::vector<DoctorCheck>& checks) {
  for (const DoctorCheck& c : checks)
    if (c.name == "gpu" && c.detail.rfind("no GPU", 0) == 0) return true;
  return false;
}

int gpu_mpi_probe_main(const std::string& libcuda) {
  const Driver* d = load_driver(libcuda);
  int n = 0;
  if (!d || d->init(0) != 0 || d->count(&n) != 0 || n == 0) {
    std::cout << "gpu mpi probe: no GPU\n";
    return 1;
  }
  // Nothing here creates a context: cuInit and cuDevicePrimaryCtxGetState do not.
  const std::string before = context_states(*d, n);
  const std::set<std::string> libs_before = mapped_cuda_libraries();
  std::string after, added;
  {
    auto world = comm::MpiCommunicator::world(/*timeout_s=*/30);
    after = context_states(*d, n);
    for (const std::string& l : mapped_cuda_libraries())
      if (!libs_before.count(l)) {
        if (!added.empty()) added += ' ';
        added += l;
      }
  }
  std::cout << "gpu mpi probe: contexts before " << before << " after " << after << "; new libraries "
            << (added.empty() ? "none" : added) << "\n";
  return 0;
}

}  // namespace ferry::runtime
