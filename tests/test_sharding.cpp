// Sharding logic in one process: the partition arithmetic, and ShardedUnits' collectives
// (bucketed or not) at world sizes 1, 2, 3 and 7 with the fake communicator (threads as
// ranks), plus the fake communicator's own collectives.
#define BOOST_TEST_MODULE sharding
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "nn/cpu_device.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/sharded_units.h"
#include "test_util.h"
#include "testing/fake_communicator.h"

using namespace ferry;
using nn::Tensor;

using test::run_ranks;

namespace {

// Value of element i of unit u: distinct everywhere, so a misplaced element shows.
float pattern(int u, int64_t i) { return static_cast<float>(u * 100000 + i + 1); }

std::vector<nn::UnitSpec> odd_units() {
  std::vector<nn::UnitSpec> units(4);
  units[0].add("a", {37, 5}, true);  // 185 elements
  units[1].add("b", {3}, false);     // a unit smaller than most world sizes' quantum
  units[1].add("c", {2, 7}, true);
  units[2].add("d", {1000}, true);
  units[3].add("e", {3}, false);     // 3 elements: fewer than 7 ranks
  return units;
}

}  // namespace

BOOST_AUTO_TEST_CASE(partition_arithmetic) {
  for (int world : {1, 2, 3, 7}) {
    for (int64_t numel : {1, 3, 15, 16, 17, 100, 1000, 4099}) {
      int64_t real = 0, next = 0;
      for (int r = 0; r < world; ++r) {
        const runtime::Partition p = runtime::partition(numel, world, r);
        BOOST_TEST(p.padded % (world * runtime::kShardAlign) == 0);
        BOOST_TEST(p.padded >= numel);
        BOOST_TEST(p.padded - numel < world * runtime::kShardAlign + 0 + (numel == 0));
        BOOST_TEST(p.shard * world == p.padded);
        BOOST_TEST(p.begin() == next);  // shards tile [0, padded) in rank order
        BOOST_TEST(p.begin() % runtime::kShardAlign == 0);
        next = p.end();
        real += p.owned_real();
      }
      BOOST_TEST(next == runtime::partition(numel, world, 0).padded);
      BOOST_TEST(real == numel);  // the real elements are owned exactly once
    }
  }
  BOOST_TEST(runtime::partition(3, 7, 6).owned_real() == 0);  // a rank with only padding
  BOOST_CHECK_THROW(runtime::partition(10, 3, 3), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(fake_collectives_compute_real_results) {
  run_ranks(3, [](int r, comm::Communicator& c) {
    std::vector<double> mine{1.0 + r, 10.0 * r};
    std::vector<double> all(6);
    c.all_gather(mine.data(), all.data(), 2, comm::DataType::f64)->wait();
    if (all != std::vector<double>{1, 0, 2, 10, 3, 20}) throw std::runtime_error("all_gather");
    std::vector<double> send{1.0 * r, 1, 2, 3, 4, 5}, recv(2);
    c.reduce_scatter(send.data(), recv.data(), 2, comm::DataType::f64, comm::ReduceOp::avg)->wait();
    const std::vector<std::vector<double>> want = {{1, 1}, {2, 3}, {4, 5}};
    if (recv != want[static_cast<size_t>(r)]) throw std::runtime_error("reduce_scatter avg");
    double x = r == 2 ? 42 : 0;
    c.broadcast(&x, 1, comm::DataType::f64, 2)->wait();
    if (x != 42) throw std::runtime_error("broadcast");
    if (c.sequence() != 3) throw std::runtime_error("sequence numbers");
  });
  // A rank that issues a different collective gets an error naming both, not a hang.
  BOOST_CHECK_THROW(run_ranks(2,
                              [](int r, comm::Communicator& c) {
                                double v = 1;
                                if (r == 0) c.all_reduce(&v, 1, comm::DataType::f64, comm::ReduceOp::sum)->wait();
                                if (r == 1) c.broadcast(&v, 1, comm::DataType::f64, 0)->wait();
                              }),
                    std::runtime_error);
}

// A rank that throws, or returns while the others still issue collectives, ends every
// other rank's wait with an error naming it: a red test, never a hang. A guard aborts the
// process if the ranks do not finish, so that a regression fails in seconds.
BOOST_AUTO_TEST_CASE(a_failing_or_departed_rank_ends_every_wait) {
  std::atomic<bool> finished{false};
  std::thread guard([&] {
    for (int i = 0; i < 600 && !finished; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!finished) {
      std::fputs("a_failing_or_departed_rank_ends_every_wait: the fake ranks hang\n", stderr);
      std::abort();
    }
  });
  std::string thrown, left;
  try {
    run_ranks(3, [](int r, comm::Communicator& c) {
      double v = 1;
      c.all_reduce(&v, 1, comm::DataType::f64, comm::ReduceOp::sum)->wait();  // all three arrive
      if (r == 1) throw std::runtime_error("boom on rank 1");
      c.all_reduce(&v, 1, comm::DataType::f64, comm::ReduceOp::sum)->wait();  // ranks 0 and 2 wait for 1
      c.barrier()->wait();
    });
  } catch (const std::runtime_error& e) {
    thrown = e.what();
  }
  try {
    run_ranks(2, [](int r, comm::Communicator& c) {
      if (r == 0) return;  // issues nothing: rank 1's barrier can never complete
      c.barrier()->wait();
    });
  } catch (const std::runtime_error& e) {
    left = e.what();
  }
  finished = true;
  guard.join();
  BOOST_TEST_MESSAGE(thrown << left);
  BOOST_TEST(thrown.find("rank 1: boom on rank 1") != std::string::npos);
  BOOST_TEST(thrown.find("rank 0: ") != std::string::npos);
  BOOST_TEST(thrown.find("rank 2: ") != std::string::npos);
  BOOST_TEST(thrown.find("aborted: rank 1: boom on rank 1") != std::string::npos);
  BOOST_TEST(left.find("rank 1: ") != std::string::npos);
  BOOST_TEST(left.find("rank 0 left the fake group") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(sharded_units_gather_and_reduce_at_every_stage) {
  const auto units = odd_units();
  for (int world : {1, 2, 3, 7}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int64_t bucket : {int64_t{500000000}, int64_t{5} * world}) {  // whole units, and tiny packed buckets
        BOOST_TEST_CONTEXT("world " << world << " stage " << stage << " bucket " << bucket) {
          run_ranks(world, [&](int rank, comm::Communicator& c) {
            nn::CpuDevice dev(64 << 20, 1);
            runtime::ZeroConfig z{stage, bucket, bucket};
            runtime::ShardedUnits su(dev, c, units, z, [&](int u, const Tensor& full) {
              for (int64_t i = 0; i < full.numel(); ++i) full.data_as<float>()[i] = pattern(u, i);
            });
            // Weights: every rank sees the full initial unit, whatever it stores.
            for (int u = 0; u < 4; ++u) {
              const auto w = su.full_weights(u);
              for (int64_t i = 0; i < static_cast<int64_t>(w.size()); ++i) {
                if (w[static_cast<size_t>(i)] != pattern(u, i)) throw std::runtime_error("weights differ at " + std::to_string(i));
              }
            }
            // Gradients: rank r adds (r + 1) * pattern, twice (two micro-batches); the unit
            // with the tied-weight pattern is released incomplete first.
            su.zero_grads();
            for (int micro = 0; micro < 2; ++micro) {
              for (int u = 3; u >= 0; --u) {
                const Tensor g = su.acquire_grads(u);
                for (int64_t i = 0; i < g.numel(); ++i) g.data_as<float>()[i] += static_cast<float>(rank + 1) * pattern(u, i);
                su.release_grads(u, /*complete=*/u != 0);
              }
              const Tensor g0 = su.acquire_grads(0);
              su.release_grads(0, true);
              (void)g0;
            }
            su.finish_gradients();
            const float ranks_sum = static_cast<float>(world * (world + 1) / 2);
            for (int u = 0; u < 4; ++u) {
              const runtime::Partition& p = su.partition_of(u);
              const Tensor g = su.grad_shard(u);
              for (int64_t k = 0; k < p.shard; ++k) {
                const int64_t i = p.begin() + k;
                const float want = i < p.numel ? 2 * ranks_sum * pattern(u, i) : 0.0f;
                if (g.data_as<float>()[k] != want) {
                  throw std::runtime_error("gradient of unit " + std::to_string(u) + " element " + std::to_string(i) +
                                           ": " + std::to_string(g.data_as<float>()[k]) + " != " + std::to_string(want));
                }
              }
              // The optimizer's range: an update there reaches every rank after publish.
              const auto o = su.owned(u);
              for (int64_t k = 0; k < o.length; ++k) o.weights.data_as<float>()[k] += 0.5f;
            }
            su.publish_params();
            for (int u = 0; u < 4; ++u) {
              const auto w = su.full_weights(u);
              for (int64_t i = 0; i < static_cast<int64_t>(w.size()); ++i) {
                if (w[static_cast<size_t>(i)] != pattern(u, i) + 0.5f) throw std::runtime_error("published weights");
              }
            }
          });
        }
      }
    }
  }
}

namespace {

// Units with frozen tensors (docs/design/adapters.md, section 1): a unit half frozen, one
// all frozen, one all trained, and a few trained elements beside a large frozen tensor.
std::vector<nn::UnitSpec> frozen_units() {
  std::vector<nn::UnitSpec> units(4);
  units[0].add("a", {37, 5}, true);
  units[0].add("f0", {50}, true);
  units[0].set_trainable(1, false);
  units[1].add("b", {3}, false);
  units[1].add("c", {2, 7}, true);
  units[1].set_trainable(0, false);
  units[1].set_trainable(1, false);
  units[2].add("d", {1000}, true);
  units[3].add("big", {300}, true);
  units[3].add("t", {3}, false);
  units[3].set_trainable(0, false);
  return units;
}

bool in_tensor(const nn::UnitSpec& u, int64_t i, bool* trainable) {
  for (const nn::TensorSpec& t : u.tensors) {
    if (i >= t.offset && i < t.offset + t.numel()) {
      *trainable = t.trainable;
      return true;
    }
  }
  return false;
}

// Every element of the model's view: tensors at pattern (+ `trained_add` where trained),
// the alignment gaps zero.
void check_weights(runtime::ShardedUnits& su, const std::vector<nn::UnitSpec>& units, float trained_add) {
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const auto w = su.full_weights(u);
    for (int64_t i = 0; i < static_cast<int64_t>(w.size()); ++i) {
      bool trainable = false;
      const float want = in_tensor(units[static_cast<size_t>(u)], i, &trainable)
                             ? pattern(u, i) + (trainable ? trained_add : 0.0f)
                             : 0.0f;
      if (w[static_cast<size_t>(i)] != want) {
        throw std::runtime_error("unit " + std::to_string(u) + " element " + std::to_string(i) + ": " +
                                 std::to_string(w[static_cast<size_t>(i)]) + " != " + std::to_string(want));
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(frozen_tensors_are_gathered_never_reduced_or_written_at_every_stage) {
  const auto units = frozen_units();
  BOOST_TEST(units[1].trainable_numel == 0);
  BOOST_TEST(units[3].trainable_numel == 3);
  for (int world : {1, 2, 3, 7}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int64_t bucket : {int64_t{500000000}, int64_t{5} * world}) {
        BOOST_TEST_CONTEXT("world " << world << " stage " << stage << " bucket " << bucket) {
          run_ranks(world, [&](int rank, comm::Communicator& c) {
            nn::CpuDevice dev(64 << 20, 1);
            runtime::ZeroConfig z{stage, bucket, bucket};
            runtime::ShardedUnits su(dev, c, units, z, [&](int u, const Tensor& full) {
              for (int64_t i = 0; i < full.numel(); ++i) {
                bool trainable = false;
                if (in_tensor(units[static_cast<size_t>(u)], i, &trainable)) full.data_as<float>()[i] = pattern(u, i);
              }
            });
            check_weights(su, units, 0.0f);
            // Each span is partitioned on its own: every rank holds a share of the frozen base.
            const runtime::UnitPartition& s3 = su.spans_of(3);
            if (s3.frozen.shard * world < 300 || s3.trained.numel != 3) throw std::runtime_error("unit 3's spans");
            if (su.trains(1) || su.acquire_grads(1).defined() || su.grad_shard(1).defined() || su.owned(1).length != 0) {
              throw std::runtime_error("the frozen unit has a gradient or optimizer range");
            }
            su.zero_grads();
            for (int micro = 0; micro < 2; ++micro) {
              for (int u = 3; u >= 0; --u) {
                const Tensor g = su.acquire_grads(u);
                if (g.defined() && g.numel() != units[static_cast<size_t>(u)].trainable_numel) {
                  throw std::runtime_error("gradient buffer of unit " + std::to_string(u) + " is " + g.describe());
                }
                for (int64_t i = 0; g.defined() && i < g.numel(); ++i) {
                  g.data_as<float>()[i] += static_cast<float>(rank + 1) * pattern(u, i);
                }
                su.release_grads(u, true);
              }
            }
            su.finish_gradients();
            const float ranks_sum = static_cast<float>(world * (world + 1) / 2);
            int64_t grads = 0;
            for (int u : {0, 2, 3}) {
              const runtime::Partition& p = su.partition_of(u);
              if (p.numel != units[static_cast<size_t>(u)].trainable_numel) throw std::runtime_error("trainable partition");
              grads += (stage <= 1 ? p.padded : 0) + (stage >= 1 ? p.shard : 0);
              const Tensor g = su.grad_shard(u);
              for (int64_t k = 0; k < p.shard; ++k) {
                const int64_t i = p.begin() + k;
                const float want = i < p.numel ? 2 * ranks_sum * pattern(u, i) : 0.0f;
                if (g.data_as<float>()[k] != want) throw std::runtime_error("gradient of unit " + std::to_string(u));
              }
              const auto o = su.owned(u);
              for (int64_t k = 0; k < o.length; ++k) {
                if (o.begin + k < p.numel) o.weights.data_as<float>()[k] += 0.5f;
              }
            }
            // No gradient memory for frozen tensors: the trainable spans' buffers only.
            if (su.state_bytes().gradients != static_cast<size_t>(grads) * 4) {
              throw std::runtime_error("gradient bytes " + std::to_string(su.state_bytes().gradients));
            }
            for (int u = 0; u < 4; ++u) su.mark_updating(u);
            su.publish_params();
            check_weights(su, units, 0.5f);
            if (stage == 3) {  // each rank stores its shard of each span
              int64_t stored = 0;
              for (int u = 0; u < 4; ++u) stored += su.spans_of(u).stored();
              if (su.state_bytes().weights != static_cast<size_t>(stored) * 4) throw std::runtime_error("stored shards");
            }
          });
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(stage3_keeps_only_a_shard_between_uses) {
  const auto units = odd_units();
  run_ranks(4, [&](int, comm::Communicator& c) {
    nn::CpuDevice dev(64 << 20, 1);
    runtime::ShardedUnits su(dev, c, units, {3, 500000000, 500000000}, [](int, const Tensor&) {});
    const size_t resting = dev.memory().in_use;
    {
      const Tensor w = su.acquire_weights(2);
      const size_t gathered = dev.memory().in_use - resting;
      if (gathered != static_cast<size_t>(su.partition_of(2).padded) * 4) throw std::runtime_error("gathered size");
      su.release_weights(2);
    }  // the model drops its view of the weights, as GPT does after each unit
    if (dev.memory().in_use != resting) throw std::runtime_error("the gathered unit was not freed");
    // Persistent state: weights and gradient shards, 1/4 of the padded units each.
    int64_t padded = 0;
    for (int u = 0; u < 4; ++u) padded += su.partition_of(u).padded;
    if (su.state_bytes().weights != static_cast<size_t>(padded)) throw std::runtime_error("weights are not 1/4");
  });
}

// The stage table of runtime/zero/stage_policy.h, field by field, fp32 and bf16 compute.
BOOST_AUTO_TEST_CASE(stage_policy_table) {
  using runtime::ReduceKind;
  struct Row {
    bool full_weights, sharded_weights, full_grads, grad_shard;
    ReduceKind reduction;
    bool every_micro, whole_unit, refresh_gathers;
  };
  const Row rows[4] = {
      {true, false, true, false, ReduceKind::all_reduce, false, true, false},
      {true, false, true, true, ReduceKind::reduce_scatter, false, false, true},
      {true, false, false, true, ReduceKind::reduce_scatter, true, false, true},
      {false, true, false, true, ReduceKind::reduce_scatter, true, false, false},
  };
  for (int stage = 0; stage < 4; ++stage) {
    for (nn::DType compute : {nn::DType::f32, nn::DType::bf16}) {
      const runtime::StagePolicy p = runtime::StagePolicy::of(stage, compute);
      const Row& r = rows[stage];
      const bool low = compute == nn::DType::bf16;
      BOOST_TEST_CONTEXT(p.describe()) {
        BOOST_TEST(p.stage == stage);
        BOOST_TEST(p.full_weights == r.full_weights);
        BOOST_TEST(p.sharded_weights == r.sharded_weights);
        BOOST_TEST(p.compute_copy == (low && stage < 3));
        BOOST_TEST(p.full_grads == r.full_grads);
        BOOST_TEST(p.grad_shard == r.grad_shard);
        BOOST_TEST((p.reduction == r.reduction));
        BOOST_TEST(p.reduce_every_micro == r.every_micro);
        BOOST_TEST(p.updates_whole_unit == r.whole_unit);
        BOOST_TEST(p.refresh_gathers == r.refresh_gathers);
        BOOST_TEST(p.refresh_after_update == (r.refresh_gathers || (stage == 0 && low)));
      }
    }
  }
  BOOST_CHECK_THROW(runtime::StagePolicy::of(4, nn::DType::f32), std::invalid_argument);
  BOOST_CHECK_THROW(runtime::StagePolicy::of(-1, nn::DType::f32), std::invalid_argument);
}
