#include "base/cpu_set.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <stdexcept>
#include <system_error>

namespace ferry {

namespace {

// Masks sized for the largest id asked about, or for the kernel's mask on read: a node
// with more than CPU_SETSIZE (1024) CPUs needs the dynamic CPU_ALLOC form.
struct Mask {
  explicit Mask(int ncpus) : n(std::max(ncpus, 1)), bytes(CPU_ALLOC_SIZE(n)), set(CPU_ALLOC(n)) {
    if (!set) throw std::bad_alloc();
    CPU_ZERO_S(bytes, set);
  }
  ~Mask() { CPU_FREE(set); }
  Mask(const Mask&) = delete;
  Mask& operator=(const Mask&) = delete;
  int n;
  size_t bytes;
  cpu_set_t* set;
};

[[noreturn]] void bad_list(std::string_view text, const char* why) {
  throw std::invalid_argument("cpu list '" + std::string(text) + "': " + why);
}

int parse_id(std::string_view text, std::string_view part) {
  int v = -1;
  const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
  if (ec != std::errc() || end != part.data() + part.size() || part.empty()) bad_list(text, "not a cpu id");
  if (v < 0 || v >= (1 << 20)) bad_list(text, "cpu id out of range");
  return v;
}

}  // namespace

CpuSet::CpuSet(std::vector<int> cpus) : cpus_(std::move(cpus)) {
  for (int c : cpus_) {
    if (c < 0) throw std::invalid_argument("CpuSet: negative cpu id " + std::to_string(c));
  }
  std::sort(cpus_.begin(), cpus_.end());
  cpus_.erase(std::unique(cpus_.begin(), cpus_.end()), cpus_.end());
}

CpuSet CpuSet::parse(std::string_view text) {
  std::vector<int> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view part = text.substr(start, comma - start);
    while (!part.empty() && (part.front() == ' ' || part.front() == '\n')) part.remove_prefix(1);
    while (!part.empty() && (part.back() == ' ' || part.back() == '\n')) part.remove_suffix(1);
    if (part.empty()) {
      if (text.find_first_not_of(" \n") == std::string_view::npos) break;  // "" is the empty set
      bad_list(text, "empty item");
    }
    const size_t dash = part.find('-');
    const int lo = parse_id(text, part.substr(0, dash));
    const int hi = dash == std::string_view::npos ? lo : parse_id(text, part.substr(dash + 1));
    if (hi < lo) bad_list(text, "range runs backwards");
    for (int c = lo; c <= hi; ++c) ids.push_back(c);
    start = comma + 1;
  }
  return CpuSet(std::move(ids));
}

bool CpuSet::contains(int cpu) const { return std::binary_search(cpus_.begin(), cpus_.end(), cpu); }

std::string CpuSet::to_string() const {
  std::string s;
  for (size_t i = 0; i < cpus_.size();) {
    size_t j = i;
    while (j + 1 < cpus_.size() && cpus_[j + 1] == cpus_[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus_[i]);
    if (j > i) s += '-' + std::to_string(cpus_[j]);
    i = j + 1;
  }
  return s;
}

CpuSet CpuSet::slice(int i, int n) const {
  if (n < 1 || i < 0 || i >= n) throw std::invalid_argument("CpuSet::slice: slice " + std::to_string(i) + " of " + std::to_string(n));
  const size_t size = cpus_.size(), base = size / static_cast<size_t>(n), extra = size % static_cast<size_t>(n);
  const size_t idx = static_cast<size_t>(i);
  const size_t begin = idx * base + std::min(idx, extra), len = base + (idx < extra ? 1 : 0);
  return CpuSet(std::vector<int>(cpus_.begin() + static_cast<ptrdiff_t>(begin),
                                 cpus_.begin() + static_cast<ptrdiff_t>(begin + len)));
}

CpuSet CpuSet::without_last(int k) const {
  if (k < 0) throw std::invalid_argument("CpuSet::without_last: negative count");
  if (static_cast<size_t>(k) >= cpus_.size()) return CpuSet();
  return CpuSet(std::vector<int>(cpus_.begin(), cpus_.end() - k));
}

CpuSet allowed_cpus() {
  // The kernel refuses (EINVAL) a mask smaller than its own: grow until it fits.
  for (int n = CPU_SETSIZE;; n *= 2) {
    Mask m(n);
    if (sched_getaffinity(0, m.bytes, m.set) == 0) {
      std::vector<int> ids;
      for (int c = 0; c < static_cast<int>(m.bytes * 8); ++c) {
        if (CPU_ISSET_S(c, m.bytes, m.set)) ids.push_back(c);
      }
      return CpuSet(std::move(ids));
    }
    if (errno != EINVAL || n >= (1 << 20)) throw std::system_error(errno, std::generic_category(), "sched_getaffinity");
  }
}

void pin_this_thread(const CpuSet& set) {
  const int n = set.empty() ? 1 : set.cpus().back() + 1;
  Mask m(n);
  for (int c : set.cpus()) CPU_SET_S(c, m.bytes, m.set);
  // pid 0: the calling thread (Linux affinity is per thread).
  if (sched_setaffinity(0, m.bytes, m.set) != 0) {
    throw std::system_error(errno, std::generic_category(), "sched_setaffinity to cpus '" + set.to_string() + "'");
  }
}

}  // namespace ferry
