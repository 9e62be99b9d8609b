// The Prefetcher (runtime/zero/prefetcher.h) on its own, with the CPU device and ranks as
// threads on the fake communicator at world sizes 1-3:
// - which positions get their gather issued by pump(), within the window depth - 1, the
//   prefetch bucket and max_live_parameters, the same on every rank; taken weights hold
//   the gathered values;
// - nvme reads run depth positions ahead, stop at a shard longer than a pool buffer and
//   at a unit whose update is pending; take() and cancel() give every pool buffer back.
#define BOOST_TEST_MODULE prefetcher
#include <boost/test/unit_test.hpp>

#include <future>
#include <mutex>

#include "nn/cpu_device.h"
#include "runtime/zero/prefetcher.h"
#include "test_util.h"

using namespace ferry;
using runtime::Prefetcher;

namespace {

// Unit 2 is longer than a pool buffer (1024 elements) at every world size up to 3.
const std::vector<int64_t> kSizes = {100, 140, 4000, 60, 80};
const std::vector<int> kOrder = {0, 1, 2, 3, 4};

float value(int unit, int64_t i) { return static_cast<float>(unit * 10000 + i); }

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// One rank's shards in `tier`, initialised to value(u, i).
struct Rig {
  nn::CpuDevice dev{64 << 20, 1};
  std::vector<runtime::UnitPartition> parts;
  std::vector<std::string> names;
  std::unique_ptr<offload::PinnedPool> pool;
  std::unique_ptr<runtime::ParamShards> shards;
  runtime::Placement place;

  Rig(comm::Communicator& c, offload::Tier tier, const std::string& dir) {
    for (size_t u = 0; u < kSizes.size(); ++u) {
      parts.push_back(runtime::unit_partition(kSizes[u], kSizes[u], kSizes[u], c.size(), c.rank()));
      names.push_back("unit" + std::to_string(u));
    }
    place.params = tier;
    place.host = &dev;
    place.param_paths = {dir};
    if (tier == offload::Tier::nvme) {
      pool = std::make_unique<offload::PinnedPool>(offload::PinnedPoolOptions{4096, 4, false, true});
      place.pool = pool.get();
    }
    shards = std::make_unique<runtime::ParamShards>(dev, parts, names, c.rank(), place);
    for (size_t u = 0; u < parts.size(); ++u) {
      const runtime::Partition& p = parts[u].trained;
      nn::Tensor full = nn::Tensor::empty(dev, nn::DType::f32, {p.padded});
      for (int64_t i = 0; i < p.padded; ++i) full.data_as<float>()[i] = value(static_cast<int>(u), i);
      shards->init(static_cast<int>(u), full.view(p.begin(), {p.shard}));
    }
  }
  std::unique_ptr<Prefetcher> prefetcher(comm::Communicator& c, const runtime::PrefetchLimits& limits) {
    return std::make_unique<Prefetcher>(runtime::StagePolicy::of(3, nn::DType::f32), limits, dev, c, parts, names,
                                        shards.get(), pool.get(), nullptr);
  }
  int64_t padded(int u) const { return parts[static_cast<size_t>(u)].trained.padded; }
};

std::vector<size_t> positions(const Prefetcher& p, bool gathering) {
  std::vector<size_t> out;
  for (const auto& f : p.flights())
    if (gathering ? f.gathering : f.reading) out.push_back(f.position);
  return out;
}

std::string str(const std::vector<size_t>& v) {
  std::string s = "{";
  for (size_t k = 0; k < v.size(); ++k) {
    if (k > 0) s.push_back(',');
    s.append(std::to_string(v[k]));
  }
  s.push_back('}');
  return s;
}

void expect(const std::vector<size_t>& got, const std::vector<size_t>& want, const std::string& what) {
  check(got == want, what + ": " + str(got) + ", expected " + str(want));
}

void check_weights(const nn::Tensor& full, int unit, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) {
    check(full.data_as<float>()[i] == value(unit, i), "unit " + std::to_string(unit) + " element " +
                                                          std::to_string(i) + " gathered wrong");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(gathers_within_the_window_and_the_limits) {
  for (int world = 1; world <= 3; ++world) {
    std::mutex mu;
    std::vector<std::string> issued;  // per rank: the positions issued, in order
    BOOST_CHECK_NO_THROW(test::run_ranks(world, [&](int, comm::Communicator& c) {
      test::TempDir dir("prefetcher_gather");
      Rig rig(c, offload::Tier::device, dir.path.string());
      runtime::PrefetchLimits limits;
      limits.depth = 3;  // gathers two positions ahead
      auto p = rig.prefetcher(c, limits);
      std::string log;
      p->pump(kOrder, 0, 0);
      expect(positions(*p, true), {0, 1}, "window at position 0");
      check(p->elements_ahead() == rig.padded(0) + rig.padded(1), "elements ahead at position 0");
      log += str(positions(*p, true));
      const std::optional<nn::Tensor> w0 = p->take(0);
      check(w0.has_value() && p->hits() == 1, "position 0 taken from its flight");
      check_weights(*w0, 0, kSizes[0]);
      check(!p->take(3).has_value(), "position 3 was not fetched");
      p->pump(kOrder, 1, rig.padded(0));
      expect(positions(*p, true), {1, 2}, "window at position 1");
      log += str(positions(*p, true));
      check_weights(*p->take(1), 1, kSizes[1]);
      check_weights(*p->take(2), 2, kSizes[2]);
      p->cancel();

      // The prefetch bucket: the second unit would pass it.
      limits.bucket = rig.padded(0) + rig.padded(1) - 1;
      p = rig.prefetcher(c, limits);
      p->pump(kOrder, 0, 0);
      expect(positions(*p, true), {0}, "within the prefetch bucket");
      log += str(positions(*p, true));
      p->cancel();
      // max_live_parameters counts the weights in use too.
      limits.bucket = 1 << 30;
      limits.max_live = 100000;
      p = rig.prefetcher(c, limits);
      p->pump(kOrder, 0, limits.max_live - rig.padded(0));
      expect(positions(*p, true), {0}, "within max_live_parameters");
      p->cancel();
      p->pump(kOrder, 0, limits.max_live);
      expect(positions(*p, true), {}, "nothing at max_live_parameters");
      // Without overlap_comm nothing is gathered ahead.
      limits.overlap_comm = false;
      p = rig.prefetcher(c, limits);
      p->pump(kOrder, 0, 0);
      check(p->flights().empty(), "no gathers ahead without overlap_comm");
      std::lock_guard<std::mutex> lock(mu);
      issued.push_back(log);
    }));
    BOOST_REQUIRE(issued.size() == static_cast<size_t>(world));
    for (const std::string& s : issued) BOOST_TEST(s == "{0,1}{1,2}{0}", "world " << world);
  }
}

BOOST_AUTO_TEST_CASE(nvme_reads_ahead_and_cancel_releases_every_buffer) {
  for (int world = 1; world <= 3; ++world) {
    BOOST_CHECK_NO_THROW(test::run_ranks(world, [&](int, comm::Communicator& c) {
      test::TempDir dir("prefetcher_nvme_r" + std::to_string(c.rank()) + "_w" + std::to_string(world));
      Rig rig(c, offload::Tier::nvme, dir.path.string());
      runtime::PrefetchLimits limits;
      limits.depth = 3;
      limits.nvme_reads = true;
      limits.overlap_comm = false;
      auto p = rig.prefetcher(c, limits);
      check(p->reads_ahead(), "a swapper for nvme reads");
      p->pump(kOrder, 0, 0);
      // Unit 2's shard is longer than a pool buffer: reads stop before it.
      expect(positions(*p, false), {0, 1}, "reads at position 0");
      expect(positions(*p, true), {}, "no gathers without overlap_comm");
      check(rig.pool->in_use() == 2, "one pool buffer per read");
      check_weights(*p->take(0), 0, kSizes[0]);
      check(rig.pool->in_use() == 1, "a taken read gives its buffer back");
      p->pump(kOrder, 3, 0);
      expect(positions(*p, false), {1, 3, 4}, "reads at position 3");
      p->cancel();
      check(p->flights().empty() && rig.pool->in_use() == 0, "cancel gives every buffer back");

      // With overlap_comm the gathers take their reads first.
      limits.overlap_comm = true;
      p = rig.prefetcher(c, limits);
      p->pump(kOrder, 3, 0);
      expect(positions(*p, true), {3, 4}, "gathers at position 3");
      check(rig.pool->in_use() == 0, "gathered reads hold no buffer");
      check_weights(*p->take(4), 4, kSizes[4]);
      p->pump(kOrder, 0, 0);
      expect(positions(*p, true), {0, 1, 3}, "gathers at position 0");
      p.reset();
      check(rig.pool->in_use() == 0, "the destructor gives every buffer back");
    }));
  }
}

BOOST_AUTO_TEST_CASE(reads_stop_at_a_unit_with_an_update_pending) {
  comm::SingleProcessCommunicator c;
  test::TempDir dir("prefetcher_update");
  Rig rig(c, offload::Tier::nvme, dir.path.string());
  runtime::PrefetchLimits limits;
  limits.depth = 2;
  limits.nvme_reads = true;
  limits.overlap_comm = false;
  auto p = rig.prefetcher(c, limits);
  runtime::UpdateWorker worker(static_cast<int>(kSizes.size()), {.threaded = true, .threads = 1, .cpus = {}});
  p->set_update_worker(&worker);
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  worker.submit(1, [gate] { gate.wait(); });
  p->pump(kOrder, 0, 0);
  BOOST_TEST(str(positions(*p, false)) == "{0}");
  go.set_value();
  worker.wait(1);
  p->pump(kOrder, 0, 0);
  BOOST_TEST(str(positions(*p, false)) == "{0,1}");
  p->cancel();
  BOOST_TEST(rig.pool->in_use() == 0);
}
