// runtime/zero/update_worker: the worker thread's OpenMP team has Options::threads threads
// pinned to Options::cpus; CPU Adam run there gives the bits it gives at one thread; and
// plan_update_worker's split of a rank's cores (docs/design/zero.md "Cores: compute, I/O and Adam").
#define BOOST_TEST_MODULE update_worker
#include <boost/test/unit_test.hpp>

#include <omp.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "base/cpu_set.h"
#include "offload/cpu_adam.h"
#include "runtime/zero/update_worker.h"

using ferry::CpuSet;

namespace ferry {
// For Boost.Test's messages.
std::ostream& operator<<(std::ostream& os, const CpuSet& s) { return os << '{' << s.to_string() << '}'; }
}  // namespace ferry
using ferry::runtime::plan_update_worker;
using ferry::runtime::UpdateWorker;

namespace {

struct TeamSeen {
  int max_threads = 0;                // omp_get_max_threads() in the job
  std::vector<int> team_sizes;        // omp_get_num_threads() per member of a region
  std::vector<CpuSet> member_cpus;    // each member's affinity
};

TeamSeen run_in_worker(const UpdateWorker::Options& o) {
  TeamSeen seen;
  std::mutex mu;
  UpdateWorker w(1, o);
  w.submit(0, [&] {
    seen.max_threads = omp_get_max_threads();
#pragma omp parallel
    {
      const CpuSet mine = ferry::allowed_cpus();
      std::lock_guard<std::mutex> lock(mu);
      seen.team_sizes.push_back(omp_get_num_threads());
      seen.member_cpus.push_back(mine);
    }
  });
  w.drain();
  return seen;
}

// The ThreadSanitizer build runs LLVM's libomp in libgomp's place (the top CMakeLists.txt),
// and clang builds (make test's sanitizer build) link libomp too. libomp keeps one pool of
// threads for the whole process and hands them to any thread's team with the mask they were
// created with (measured under clang 14: a team member bound to one core where the worker
// had two), so a team need not inherit the worker's pinning: that is libgomp's behaviour
// (each thread's team is its own), which UpdateWorker relies on and the GCC builds check
// (make test runs these cases in its release build: tests/CMakeLists.txt). Under libomp
// the team sizes are checked.
#if defined(__SANITIZE_THREAD__) || defined(__clang__)
constexpr bool kTeamsInheritPinning = false;
#else
constexpr bool kTeamsInheritPinning = true;
#endif

}  // namespace

BOOST_AUTO_TEST_CASE(team_has_the_configured_size_and_cores) {
  const CpuSet process = ferry::allowed_cpus();
  const CpuSet last({process.cpus().back()});
  for (int threads : {1, 2, 3}) {
    for (const CpuSet& cpus : {last, process}) {
      BOOST_TEST_CONTEXT("threads " << threads << ", cpus " << cpus.to_string()) {
        const TeamSeen seen = run_in_worker({.threaded = true, .threads = threads, .cpus = cpus});
        BOOST_TEST(seen.max_threads == threads);
        BOOST_TEST(seen.team_sizes == std::vector<int>(static_cast<size_t>(threads), threads));
        if (kTeamsInheritPinning) {
          for (const CpuSet& c : seen.member_cpus) BOOST_TEST(c.to_string() == cpus.to_string());
        }
      }
    }
  }
  BOOST_TEST(ferry::allowed_cpus() == process);  // the owner's thread is never pinned
}

BOOST_AUTO_TEST_CASE(unpinned_worker_inherits_the_owner_mask) {
  const TeamSeen seen = run_in_worker({.threaded = true, .threads = 2, .cpus = {}});
  BOOST_TEST(seen.team_sizes == std::vector<int>(2, 2));
  if (kTeamsInheritPinning) {
    for (const CpuSet& c : seen.member_cpus) BOOST_TEST(c == ferry::allowed_cpus());
  }
}

BOOST_AUTO_TEST_CASE(unthreaded_jobs_use_the_callers_team) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  const TeamSeen seen = run_in_worker({.threaded = false, .threads = 1, .cpus = CpuSet({0})});
  omp_set_num_threads(before);
  BOOST_TEST(seen.max_threads == 3);
  if (kTeamsInheritPinning) {
    for (const CpuSet& c : seen.member_cpus) BOOST_TEST(c == ferry::allowed_cpus());
  }
}

BOOST_AUTO_TEST_CASE(rejects_an_empty_team) {
  BOOST_CHECK_THROW(UpdateWorker(1, {.threaded = true, .threads = 0, .cpus = {}}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(adam_in_the_worker_matches_one_thread_bit_for_bit) {
  // Several tiles with a ragged end, three steps, the fused bf16 copy on.
  const int64_t n = 5 * ferry::offload::CpuAdam::kTile + 123;
  const ferry::offload::CpuAdam adam({1e-3, 0.9, 0.95, 1e-8, 0.1});
  struct State {
    std::vector<float> p, g, m, v;
    std::vector<uint16_t> bf16;
  };
  auto fresh = [&] {
    State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f),
            std::vector<uint16_t>(n)};
    for (int64_t i = 0; i < n; ++i) {
      s.p[i] = 0.01f * static_cast<float>(i % 1013) - 3.f;
      s.g[i] = 1e-3f * static_cast<float>(i % 77) - 0.03f;
    }
    return s;
  };
  auto steps = [&](State& s) {
    for (int64_t t = 1; t <= 3; ++t) adam.update(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, t, 1e-3, 0.1, 0.5, s.bf16.data());
  };
  State one = fresh();
  UpdateWorker serial(1, {.threaded = true, .threads = 1, .cpus = {}});
  serial.submit(0, [&] { steps(one); });
  serial.drain();
  const CpuSet process = ferry::allowed_cpus();
  for (int threads : {2, 3}) {
    State many = fresh();
    UpdateWorker w(1, {.threaded = true, .threads = threads, .cpus = process});
    w.submit(0, [&] { steps(many); });
    w.drain();
    BOOST_TEST_CONTEXT("threads " << threads) {
      BOOST_TEST(std::memcmp(one.p.data(), many.p.data(), n * 4) == 0);
      BOOST_TEST(std::memcmp(one.m.data(), many.m.data(), n * 4) == 0);
      BOOST_TEST(std::memcmp(one.v.data(), many.v.data(), n * 4) == 0);
      BOOST_TEST(one.bf16 == many.bf16);
    }
  }
}

BOOST_AUTO_TEST_CASE(plan_on_the_cpu_device_keeps_one_unpinned_thread) {
  const CpuSet node = CpuSet::parse("0-15");
  const UpdateWorker::Options o = plan_update_worker(true, /*gpu=*/false, 0, node, 16, 0, 1);
  BOOST_TEST(o.threaded);
  BOOST_TEST(o.threads == 1);
  BOOST_TEST(o.cpus.empty());
  BOOST_TEST(plan_update_worker(true, false, 4, node, 16, 0, 1).threads == 4);  // the knob
  BOOST_TEST(!plan_update_worker(false, false, 0, node, 16, 0, 1).threaded);   // threaded passed through
}

BOOST_AUTO_TEST_CASE(plan_on_a_gpu_gives_adam_the_ranks_cores_but_one) {
  // One rank on a 16-core node: cores 0-14, 15 threads.
  UpdateWorker::Options o = plan_update_worker(true, true, 0, CpuSet::parse("0-15"), 16, 0, 1);
  BOOST_TEST(o.cpus.to_string() == "0-14");
  BOOST_TEST(o.threads == 15);
  // Bound by the launcher (mpiexec -bind-to core:8): a rank's own 8 cores.
  o = plan_update_worker(true, true, 0, CpuSet::parse("8-15"), 16, 1, 2);
  BOOST_TEST(o.cpus.to_string() == "8-14");
  BOOST_TEST(o.threads == 7);
  // Not bound: 4 ranks share a 16-core set by local rank.
  o = plan_update_worker(true, true, 0, CpuSet::parse("0-15"), 16, 2, 4);
  BOOST_TEST(o.cpus.to_string() == "8-10");
  BOOST_TEST(o.threads == 3);
  // A rank with one core keeps it.
  o = plan_update_worker(true, true, 0, CpuSet::parse("3"), 16, 3, 16);
  BOOST_TEST(o.cpus.to_string() == "3");
  BOOST_TEST(o.threads == 1);
  // More ranks than cores: the set is not split, one core of it is left over.
  o = plan_update_worker(true, true, 0, CpuSet::parse("0-1"), 2, 1, 4);
  BOOST_TEST(o.cpus.to_string() == "0");
  BOOST_TEST(o.threads == 1);
  // The knob fixes the team size on the same cores.
  o = plan_update_worker(true, true, 2, CpuSet::parse("0-15"), 16, 0, 1);
  BOOST_TEST(o.cpus.to_string() == "0-14");
  BOOST_TEST(o.threads == 2);
  // Nothing known about the cores (allowed_cpus failed): one unpinned thread.
  o = plan_update_worker(true, true, 0, CpuSet(), 16, 0, 1);
  BOOST_TEST(o.cpus.empty());
  BOOST_TEST(o.threads == 1);
}
