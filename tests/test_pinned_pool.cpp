// The pinned host pool: allocated up front, aligned, bounded; the RLIMIT_MEMLOCK message;
// registration of its slab as io_uring fixed buffers.
#define BOOST_TEST_MODULE pinned_pool
#include <boost/test/unit_test.hpp>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "offload/pinned_pool.h"
#include "offload/storage.h"
#include "offload/swapper.h"

using namespace ferry::offload;

BOOST_AUTO_TEST_CASE(buffers_are_aligned_distinct_and_bounded) {
  PinnedPool pool({100000, 3, /*pin=*/true, /*allow_unpinned=*/true});
  BOOST_TEST(pool.buffer_size() == 102400u);  // rounded up to 4 KiB pages
  BOOST_TEST(pool.bytes() == 3u * 102400u);
  if (!pool.pinned()) BOOST_TEST_MESSAGE("not pinned here: " << pool.warning());
  void* a = pool.acquire();
  void* b = pool.acquire();
  void* c = pool.acquire();
  for (void* p : {a, b, c}) BOOST_TEST(reinterpret_cast<uintptr_t>(p) % 4096 == 0u);
  BOOST_TEST((a != b && b != c && a != c));
  BOOST_TEST(pool.in_use() == 3);
  // A fourth acquire waits until a buffer comes back: transfers in flight are bounded.
  std::atomic<bool> got{false};
  std::thread t([&] {
    void* d = pool.acquire();
    got = true;
    pool.release(d);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(!got.load());
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
  pool.release(buf);
  pool.release(back);
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
    slab = pool.regions()[0].first;
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
