// comm/'s host-side parts on their own, without MPI: the Work handle (completion, failure,
// timed waits, from another thread), the watchdog (one report naming the overdue collective
// and its wait, none for collectives that end in time or while disabled), the funnel every
// collective goes through (argument checks, sequence numbers, the ring of recent ops),
// the single-process and counting backends, the hand-written reductions, and the
// nodes' description. What needs ranks runs in test_zero_mpi, the watchdog's job-wide
// report in watchdog_skipped_collective, the hosts in multi_host.
#define BOOST_TEST_MODULE comm
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/counting_communicator.h"
#include "comm/peers.h"
#include "comm/watchdog.h"
#include "comm/work.h"

using namespace ferry::comm;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(work_completes_fails_and_waits_across_threads) {
  Work ok("all_reduce #1");
  BOOST_TEST(!ok.test());
  BOOST_TEST(!ok.wait_for(10ms));
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    ok.mark_started();
    ok.complete();
  });
  ok.wait();  // returns once the other thread completes it
  t.join();
  BOOST_TEST(ok.test());
  BOOST_TEST(ok.error().empty());
  BOOST_TEST((ok.finished_at() >= ok.started_at()));

  Work bad("reduce_scatter #2");
  bad.fail("rank 1 left");
  BOOST_TEST(bad.test());
  BOOST_TEST(bad.wait_for(0s));
  BOOST_TEST(bad.error() == "rank 1 left");
  BOOST_CHECK_EXCEPTION(bad.wait(), CommError,
                        [](const CommError& e) { return std::string(e.what()).find("rank 1 left") != std::string::npos; });
}

BOOST_AUTO_TEST_CASE(watchdog_reports_an_overdue_collective_once) {
  std::mutex mu;
  std::vector<std::string> reports;
  Watchdog dog(0.2, [&](const std::string& r) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(r);
  });
  const uint64_t quick = dog.begin("rank 0: all_gather #1");
  dog.end(quick);  // in time: never reported
  dog.begin("rank 0: reduce_scatter #2");
  dog.begin("rank 0: all_reduce #3");  // also overdue, but the first report ends the job
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(20ms);
    std::lock_guard<std::mutex> lock(mu);
    if (!reports.empty()) break;
  }
  std::this_thread::sleep_for(300ms);  // a second report would come within this
  std::lock_guard<std::mutex> lock(mu);
  BOOST_TEST_REQUIRE(reports.size() == 1u);
  BOOST_TEST(reports[0].find("reduce_scatter #2") != std::string::npos, reports[0]);
  BOOST_TEST(reports[0].find("has not completed after") != std::string::npos, reports[0]);
  BOOST_TEST(reports[0].find("comm.timeout_s = 0.2") != std::string::npos, reports[0]);
}

BOOST_AUTO_TEST_CASE(watchdog_disabled_until_given_a_timeout) {
  std::atomic<int> fired{0};
  Watchdog dog(0, [&](const std::string&) { ++fired; });
  dog.begin("rank 0: barrier #1");
  std::this_thread::sleep_for(150ms);
  BOOST_TEST(fired.load() == 0);
  dog.set_timeout(0.05);
  for (int i = 0; i < 100 && fired.load() == 0; ++i) std::this_thread::sleep_for(20ms);
  BOOST_TEST(fired.load() == 1);
}

BOOST_AUTO_TEST_CASE(the_funnel_checks_numbers_and_remembers_collectives) {
  SingleProcessCommunicator c;
  std::vector<float> a = {1, 2, 3}, b(3);
  c.all_gather(a.data(), b.data(), 3, DataType::f32)->wait();
  BOOST_TEST(b == a);
  std::vector<double> v = {0.5, 1.5};
  c.all_reduce_sum(v);  // one rank: the sum of one
  BOOST_TEST(v == (std::vector<double>{0.5, 1.5}));
  BOOST_TEST(c.sequence() == 2u);
  BOOST_CHECK_THROW(c.all_reduce(nullptr, 4, DataType::f32, ReduceOp::sum), std::invalid_argument);
  BOOST_CHECK_THROW(c.broadcast(a.data(), 3, DataType::f32, 1), std::invalid_argument);  // root outside [0, 1)
  std::vector<uint16_t> h(2);
  BOOST_CHECK_THROW(c.all_reduce(h.data(), 2, DataType::u16, ReduceOp::sum), std::invalid_argument);
  std::vector<int32_t> n(2);
  BOOST_CHECK_THROW(c.all_reduce(n.data(), 2, DataType::i32, ReduceOp::avg), std::invalid_argument);
  BOOST_TEST(c.sequence() == 2u);  // refused calls take no number
  const std::string recent = c.recent_ops();
  BOOST_TEST(recent.find("all_gather #1 (3 x f32 = 12 bytes per rank)") != std::string::npos, recent);
  BOOST_TEST(recent.find("all_reduce #2") != std::string::npos, recent);
  for (int i = 0; i < 20; ++i) c.barrier()->wait();
  // 22 collectives so far: the ring keeps the last 16, #7 to #22.
  BOOST_TEST(c.recent_ops().find("#6 (") == std::string::npos, c.recent_ops());
  BOOST_TEST(c.recent_ops().find("barrier #7 (") != std::string::npos, c.recent_ops());
  BOOST_TEST(c.recent_ops().find("barrier #22 (") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(counting_communicator_counts_what_a_rank_would_send) {
  CountingCommunicator c(1, 4);
  BOOST_TEST(c.rank() == 1);
  BOOST_TEST(c.size() == 4);
  std::vector<float> shard(8), full(32);
  c.all_gather(shard.data(), full.data(), 8, DataType::f32)->wait();
  c.reduce_scatter(full.data(), shard.data(), 8, DataType::f32, ReduceOp::avg)->wait();
  c.reduce_scatter(full.data(), shard.data(), 8, DataType::f32, ReduceOp::sum)->wait();
  BOOST_TEST(c.ops(OpKind::all_gather) == 1u);
  BOOST_TEST(c.ops(OpKind::reduce_scatter) == 2u);
  BOOST_TEST(c.bytes(OpKind::reduce_scatter) == 2u * 8 * sizeof(float));
  BOOST_TEST(c.ops(OpKind::all_reduce) == 0u);
  BOOST_CHECK_THROW(CountingCommunicator(4, 4), std::invalid_argument);
  BOOST_CHECK_THROW(CountingCommunicator(0, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(hand_reductions_and_scaling) {
  std::vector<float> f = {1, 2}, g = {0.5f, -2};
  reduce_into(f.data(), g.data(), 2, DataType::f32);
  BOOST_TEST(f == (std::vector<float>{1.5f, 0}));
  std::vector<uint8_t> u = {250, 1}, w = {10, 2};
  reduce_into(u.data(), w.data(), 2, DataType::u8);  // wraps, as a u8 sum does
  BOOST_TEST(u == (std::vector<uint8_t>{4, 3}));
  std::vector<uint16_t> h(1);
  BOOST_CHECK_THROW(reduce_into(h.data(), h.data(), 1, DataType::u16), std::invalid_argument);
  std::vector<double> d = {2, 4};
  scale_by(d.data(), 2, DataType::f64, 0.25);
  BOOST_TEST(d == (std::vector<double>{0.5, 1}));
}

BOOST_AUTO_TEST_CASE(nodes_are_described_by_host_in_rank_order) {
  const std::vector<RankInfo> ranks = {{"a", 10}, {"a", 11}, {"b", 20}, {"b", 21}};
  BOOST_TEST(describe_nodes(ranks) == "2 node(s): a (ranks 0-1), b (ranks 2-3)");
  BOOST_TEST(describe_nodes({{"a", 1}, {"b", 2}, {"a", 3}}) == "2 node(s): a (ranks 0, 2), b (rank 1)");
}
