// The pinned host pool: allocated up front, aligned, bounded; the RLIMIT_MEMLOCK message;
// registration of its slab as io_uring fixed buffers.
#define BOOST_TEST_MODULE pinned_pool
#include <boost/test/unit_test.hpp>

#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "offload/io_uring_storage.h"
#include "offload/pinned_pool.h"
#include "offload/storage.h"
#include "offload/swapper.h"

using namespace ferry::offload;

BOOST_AUTO_TEST_CASE(buffers_are_aligned_distinct_and_bounded) {
  PinnedPool pool({100000, 3, /*pin=*/true, /*allow_unpinned=*/true});
  BOOST_TEST(pool.buffer_size() == 102400u);  // rounded up to 4 KiB pages
  BOOST_TEST(pool.bytes() == 3u * 102400u);
  // On a huge page boundary, so that the advised huge pages can back the slab from its start.
  BOOST_TEST(reinterpret_cast<uintptr_t>(pool.slab()) % (uintptr_t{2} << 20) == 0u);
  if (!pool.pinned()) BOOST_TEST_MESSAGE("not pinned here: " << pool.warning());
  void* a = pool.acquire();
  void* b = pool.acquire();
  void* c = pool.acquire();
  for (void* p : {a, b, c}) BOOST_TEST(reinterpret_cast<uintptr_t>(p) % 4096 == 0u);
  BOOST_TEST((a != b && b != c && a != c));
  BOOST_TEST(pool.in_use() == 3);
  // A fourth acquire waits until a buffer comes back: transfers in flight are bounded.
  // The test sees the thread blocked inside acquire() (not a sleep that hopes it got there).
  std::atomic<bool> got{false};
  std::thread t([&] {
    void* d = pool.acquire();
    got = true;
    pool.release(d);
  });
  while (pool.waiting() == 0 && !got.load()) std::this_thread::yield();
  BOOST_TEST(!got.load());
  BOOST_TEST(pool.waiting() == 1);
  pool.release(b);
  t.join();
  BOOST_TEST(got.load());
  pool.release(a);
  pool.release(c);
  BOOST_TEST(pool.in_use() == 0);
  BOOST_CHECK_THROW(pool.release(static_cast<char*>(a) + 8), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(memlock_limit_message_says_how_to_raise_it) {
  BOOST_TEST(memlock_problem(1 << 20, 8 << 20, false).empty());
  BOOST_TEST(memlock_problem(1 << 30, 8 << 20, true).empty());  // CAP_IPC_LOCK lifts the limit
  const std::string m = memlock_problem(1 << 30, 8 << 20, false);
  BOOST_TEST(m.find("1073741824") != std::string::npos, m);  // what is needed
  BOOST_TEST(m.find("8388608") != std::string::npos, m);     // the limit
  BOOST_TEST(m.find("ulimit -l") != std::string::npos, m);
  BOOST_TEST(m.find("pin_memory: false") != std::string::npos, m);
  // The pool itself, when this process may not exceed its limit (not root): refuse, or
  // continue unpinned when allowed.
  struct rlimit rl{};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  if (geteuid() == 0) {
    BOOST_TEST_MESSAGE("root may lock any amount: the refusal path is covered through memlock_problem only");
  } else if (rl.rlim_cur != RLIM_INFINITY) {
    const size_t too_much = static_cast<size_t>(rl.rlim_cur) + (64 << 20);
    BOOST_CHECK_THROW(PinnedPool({too_much, 1, true, false}), PinnedMemoryError);
    PinnedPool unpinned({too_much, 1, true, true});
    BOOST_TEST(!unpinned.pinned());
    BOOST_TEST(unpinned.warning().find("RLIMIT_MEMLOCK") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(slab_registers_as_io_uring_fixed_buffers) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ferry_pool_" + std::to_string(getpid()));
  fs::create_directories(dir);
  PinnedPool pool({1 << 20, 2, true, true});
  StorageOptions o;
  o.paths = {dir.string()};
  o.capacity = 4 << 20;
  auto s = make_storage(o, nullptr);
  s->register_buffers(pool.regions());
  char* buf = static_cast<char*>(pool.acquire());
  for (int i = 0; i < (1 << 20); ++i) buf[i] = static_cast<char>(i * 7);
  s->write(1 << 20, buf, 1 << 20);
  char* back = static_cast<char*>(pool.acquire());
  s->read(1 << 20, back, 1 << 20);
  BOOST_TEST(std::memcmp(buf, back, 1 << 20) == 0);
  // Registering nothing unregisters: the same buffers then go as plain requests.
  s->register_buffers({});
  if (auto* u = dynamic_cast<IoUringStorage*>(s.get())) BOOST_TEST(!u->has_fixed_buffers());
  std::memset(back, 0, 1 << 20);
  s->read(1 << 20, back, 1 << 20);
  BOOST_TEST(std::memcmp(buf, back, 1 << 20) == 0);
  pool.release(buf);
  pool.release(back);
  s.reset();
  fs::remove_all(dir);
}

// io_uring refuses a fixed buffer over 1 GiB with EFAULT (the oversize example's 5.25 GiB
// pool ran without fixed buffers, warning "Bad address"): the slab registers in pieces of
// whole buffers, at most 1 GiB each, and a transfer from the last piece uses it.
BOOST_AUTO_TEST_CASE(a_slab_over_1_gib_registers_in_pieces) {
  {
    PinnedPool plan({300 << 20, 8, false, true, /*count_only=*/true});  // 2.34 GiB of address space
    const auto r = plan.regions();
    BOOST_TEST(r.size() == 3u);  // 3 + 3 + 2 buffers
    size_t total = 0;
    for (const auto& [p, n] : r) {
      BOOST_TEST(n <= PinnedPool::kMaxFixedBuffer);
      BOOST_TEST(n % plan.buffer_size() == 0u);
      BOOST_TEST(static_cast<char*>(p) == static_cast<char*>(plan.slab()) + total);
      total += n;
    }
    BOOST_TEST(total == plan.bytes());
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ferry_pool_big_" + std::to_string(getpid()));
  fs::create_directories(dir);
  PinnedPool pool({size_t{384} << 20, 3, /*pin=*/false, true});  // 1.125 GiB: two pieces
  BOOST_TEST(pool.regions().size() == 2u);
  StorageOptions o;
  o.paths = {dir.string()};
  o.capacity = 8 << 20;
  std::string warning;
  auto s = make_storage(o, &warning);
  auto* u = dynamic_cast<IoUringStorage*>(s.get());
  if (!u) {
    BOOST_TEST_MESSAGE("skipped: io_uring refused: " << warning);
    fs::remove_all(dir);
    return;
  }
  try {
    s->register_buffers(pool.regions());
  } catch (const StorageError& e) {
    fs::remove_all(dir);
    if (e.err == ENOMEM && !may_exceed_memlock()) {  // registration counts against RLIMIT_MEMLOCK
      BOOST_TEST_MESSAGE("skipped: RLIMIT_MEMLOCK is below 1.125 GiB for this user: " << e.what());
      return;
    }
    BOOST_FAIL("registering a 1.125 GiB slab in pieces failed: " << e.what());
  }
  BOOST_TEST(u->has_fixed_buffers());
  void* a = pool.acquire();
  void* b = pool.acquire();
  char* last = static_cast<char*>(pool.acquire());  // in the second piece
  BOOST_TEST(last >= static_cast<char*>(pool.regions()[1].first));
  for (int i = 0; i < (4 << 20); ++i) last[i] = static_cast<char>(i * 13);
  s->write(0, last, 4 << 20);
  std::vector<char> want(last, last + (4 << 20));
  std::memset(last, 0, 4 << 20);
  s->read(0, last, 4 << 20);
  BOOST_TEST(std::memcmp(last, want.data(), 4 << 20) == 0);
  pool.release(a);
  pool.release(b);
  pool.release(last);
  s.reset();
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(swapper_runs_jobs_ahead_in_order_and_bounded) {
  PinnedPool pool({4096, 3, true, true});
  Swapper swapper(pool, 2);
  std::vector<int> ran;
  std::mutex mu;
  std::vector<Swapper::Ticket> tickets;
  for (int i = 0; i < 3; ++i) {
    tickets.push_back(swapper.submit([&, i](void* buf) {
      std::memset(buf, i + 1, 4096);
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(i);
    }));
  }
  BOOST_TEST(pool.in_use() == 3);  // every buffer is in flight: a fourth submit would wait
  for (int i = 0; i < 3; ++i) {
    auto* buf = static_cast<unsigned char*>(swapper.wait(tickets[static_cast<size_t>(i)]));
    BOOST_TEST(buf[0] == i + 1);
    BOOST_TEST(buf[4095] == i + 1);
    swapper.release(buf);
  }
  BOOST_TEST((ran == std::vector<int>{0, 1, 2}));  // in submission order
  BOOST_TEST(pool.in_use() == 0);
  // A failing job's error reaches wait(); its buffer goes back to the pool.
  const auto bad = swapper.submit([](void*) { throw StorageError("/x/ferry.swp", 4096, 4096, EIO, "read"); });
  BOOST_CHECK_THROW(swapper.wait(bad), StorageError);
  BOOST_TEST(pool.in_use() == 0);
  // A prefetch nobody needs is cancelled: buffer back, error ignored.
  swapper.cancel(swapper.submit([](void*) { throw std::runtime_error("unused"); }));
  BOOST_TEST(pool.in_use() == 0);
}

// CUDA registration is the caller's (device.type cuda passes nn::cuda_register_host): a
// pool without the hooks registers nothing and loads nothing, GPU or not (review F17);
// with them, the slab is registered once and unregistered on destruction, and a refusal
// is a warning, not an error.
BOOST_AUTO_TEST_CASE(cuda_registration_only_through_the_hooks) {
  {
    PinnedPool pool({4096, 1, true, true});
    BOOST_TEST(!pool.cuda_registered());
  }
  std::vector<std::pair<void*, size_t>> registered;
  std::vector<void*> unregistered;
  PinnedPoolOptions o{4096, 2, true, true};
  HostRegistration reg;
  reg.add = [&](void* p, size_t n) {
    registered.emplace_back(p, n);
    return std::string();
  };
  reg.remove = [&](void* p) { unregistered.push_back(p); };
  void* slab = nullptr;
  {
    PinnedPool pool(o, reg);
    BOOST_TEST(pool.cuda_registered());
    slab = pool.slab();
    BOOST_TEST(registered.size() == 1u);
    BOOST_TEST(registered[0].first == slab);
    BOOST_TEST(registered[0].second == pool.bytes());
    BOOST_TEST(unregistered.empty());
  }
  BOOST_TEST((unregistered == std::vector<void*>{slab}));
  HostRegistration refused = reg;
  refused.add = [](void*, size_t) { return std::string("cudaHostRegister refused"); };
  unregistered.clear();
  {
    PinnedPool pool(o, refused);
    BOOST_TEST(!pool.cuda_registered());
    BOOST_TEST(pool.warning().find("cudaHostRegister refused") != std::string::npos);
  }
  BOOST_TEST(unregistered.empty());  // nothing registered, nothing undone
  o.pin = false;  // pin_memory false: not registered either
  registered.clear();
  PinnedPool unpinned(o, reg);
  BOOST_TEST(registered.empty());
}
