// Storage: offset-derived patterns verified byte for byte after random writes and reads,
// through io_uring (fixed buffers too), pread/pwrite with O_DIRECT and buffered, striped
// over two folders; injected faults (EIO, ENOSPC, short transfers, EINTR, EAGAIN); bad
// folders; the swap files an abort removes. Skips, saying why, where the system refuses O_DIRECT or io_uring.
#define BOOST_TEST_MODULE storage
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <thread>

#include "base/io_faults.h"
#include "base/scratch_files.h"
#include "nn/rng.h"
#include "offload/io_uring_storage.h"
#include "offload/storage.h"
#include "test_util.h"

using namespace ferry;
using offload::StorageError;
namespace fs = std::filesystem;

namespace {

struct TempDirs {
  test::TempDir dir{"storage"};
  fs::path root = dir.path;
  std::vector<std::string> two;
  TempDirs() {
    fs::create_directories(root / "a");
    fs::create_directories(root / "b");
    two = {(root / "a").string(), (root / "b").string()};
  }
};

// The byte every storage must hold at logical offset o after write_pattern.
uint8_t pattern(uint64_t o, uint64_t salt) { return static_cast<uint8_t>((o * 2654435761u) >> 13 ^ salt); }

struct AlignedBuffer {
  uint8_t* p;
  size_t n;
  explicit AlignedBuffer(size_t bytes) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))), n(bytes) {}
  ~AlignedBuffer() { std::free(p); }
};

void fill(uint8_t* p, uint64_t offset, size_t len, uint64_t salt) {
  for (size_t i = 0; i < len; ++i) p[i] = pattern(offset + i, salt);
}

// Index of the first byte of `p` (covering [offset, offset + len)) that breaks the pattern, or -1.
int64_t first_bad(const uint8_t* p, uint64_t offset, size_t len, uint64_t salt) {
  for (size_t i = 0; i < len; ++i)
    if (p[i] != pattern(offset + i, salt)) return static_cast<int64_t>(i);
  return -1;
}

bool direct_supported(const std::string& folder, std::string* why) {
  const std::string probe = folder + "/probe";
  const int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
  if (fd < 0) {
    *why = "O_DIRECT refused on " + folder + ": " + std::strerror(errno);
    return false;
  }
  close(fd);
  unlink(probe.c_str());
  return true;
}

offload::StorageOptions options(const std::vector<std::string>& paths, bool uring, bool direct) {
  offload::StorageOptions o;
  o.paths = paths;
  o.capacity = 8 << 20;
  o.aio.block_size = 64 << 10;  // small blocks: requests split and stripes alternate often
  o.aio.queue_depth = 4;
  o.allow_io_uring = uring;
  o.allow_direct = direct;
  return o;
}

// Random aligned writes over the whole store, then reads of random ranges, all checked.
void random_round_trips(offload::Storage& s, uint64_t salt) {
  const size_t a = std::max<size_t>(s.alignment(), 4096);
  const uint64_t cap = s.capacity();
  AlignedBuffer all(cap);
  fill(all.p, 0, cap, salt);
  s.write(0, all.p, cap);
  nn::Rng rng(salt);
  AlignedBuffer buf(1 << 20);
  for (int i = 0; i < 40; ++i) {
    const uint64_t off = rng.below(cap / a) * a;
    const size_t len = static_cast<size_t>(std::min<uint64_t>((1 + rng.below((1 << 20) / a)) * a, cap - off));
    if (i % 2 == 0) {  // rewrite a range with another salt, and mirror it in `all`
      fill(buf.p, off, len, salt + 1);
      s.write(off, buf.p, len);
      fill(all.p + off, off, len, salt + 1);
    }
    std::memset(buf.p, 0xee, len);
    s.read(off, buf.p, len);
    BOOST_REQUIRE_MESSAGE(std::memcmp(buf.p, all.p + off, len) == 0,
                          s.describe() << ": range at " << off << " (" << len << " bytes) differs");
  }
  // The whole store read back in one request (split across stripes and blocks): every
  // byte as the writes above left it.
  AlignedBuffer back(cap);
  std::memset(back.p, 0xee, cap);
  s.read(0, back.p, cap);
  s.sync();
  for (uint64_t o = 0; o < cap; o += 4096) {
    BOOST_REQUIRE_MESSAGE(std::memcmp(back.p + o, all.p + o, std::min<uint64_t>(4096, cap - o)) == 0,
                          s.describe() << ": the whole-store read differs in the block at " << o);
  }
}

// io_uring where the kernel allows it, else the test is skipped with the reason (a
// seccomp filter, an old kernel): never a pass on the fallback path.
std::unique_ptr<offload::Storage> io_uring_storage(const offload::StorageOptions& o, std::string* skipped) {
  std::string warning;
  auto s = offload::make_storage(o, &warning);
  if (!dynamic_cast<offload::IoUringStorage*>(s.get())) {
    *skipped = "io_uring refused: " + warning;
    return nullptr;
  }
  BOOST_TEST(s->describe().find("io_uring") != std::string::npos, s->describe());
  return s;
}

// Preconditions of the cases that need io_uring with O_DIRECT: where the kernel or the
// folder refuses them (a seccomp filter, an old kernel, tmpfs), Boost reports the case
// skipped with the reason, and ctest shows the test skipped when every case was (its
// report, tests/CMakeLists.txt); never a pass on the fallback path.
struct IoUringDirectWorks {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    TempDirs d;
    std::string why;
    if (!direct_supported(d.two[0], &why)) {
      boost::test_tools::assertion_result r(false);
      r.message() << why;
      return r;
    }
    std::string warning;
    auto s = offload::make_storage(options({d.two[0]}, true, true), &warning);
    boost::test_tools::assertion_result r(dynamic_cast<offload::IoUringStorage*>(s.get()) != nullptr);
    if (!r) r.message() << "io_uring refused: " << warning;
    return r;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(io_uring_direct_striped, *boost::unit_test::precondition(IoUringDirectWorks{})) {
  TempDirs d;
  std::string warning;
  auto s = offload::make_storage(options(d.two, true, true), &warning);
  BOOST_TEST_REQUIRE(dynamic_cast<offload::IoUringStorage*>(s.get()) != nullptr, warning);
  BOOST_TEST(warning.empty(), warning);
  BOOST_TEST(s->alignment() == 4096u);
  BOOST_TEST(s->describe().find("io_uring O_DIRECT") != std::string::npos);
  random_round_trips(*s, 7);
}

BOOST_AUTO_TEST_CASE(io_uring_with_registered_buffers, *boost::unit_test::precondition(IoUringDirectWorks{})) {
  TempDirs d;
  std::string warning;
  auto s = offload::make_storage(options({d.two[0]}, true, true), &warning);
  auto* u = dynamic_cast<offload::IoUringStorage*>(s.get());
  BOOST_TEST_REQUIRE(u != nullptr, warning);
  AlignedBuffer pool(2 << 20);
  try {
    s->register_buffers({{pool.p, pool.n}});
  } catch (const StorageError& e) {
    BOOST_TEST_MESSAGE("skipped: " << e.what());
    return;
  }
  BOOST_TEST(u->has_fixed_buffers());
  fill(pool.p, 4096 * 3, 1 << 20, 11);
  s->write(4096 * 3, pool.p, 1 << 20);  // from inside the registered region: fixed writes
  std::memset(pool.p + (1 << 20), 0, 1 << 20);
  s->read(4096 * 3, pool.p + (1 << 20), 1 << 20);
  BOOST_TEST(first_bad(pool.p + (1 << 20), 4096 * 3, 1 << 20, 11) == -1);
}

BOOST_AUTO_TEST_CASE(pread_fallback_direct_and_buffered) {
  TempDirs d;
  for (bool direct : {true, false}) {
    std::string warning;
    auto s = offload::make_storage(options(d.two, /*uring=*/false, direct), &warning);
    BOOST_TEST(s->describe().find("pread/pwrite") != std::string::npos);
    random_round_trips(*s, direct ? 3 : 5);
  }
}

BOOST_AUTO_TEST_CASE(parallel_pread_path) {
  TempDirs d;
  auto o = options(d.two, false, true);
  o.aio.intra_op_parallelism = 3;
  auto s = offload::make_storage(o, nullptr);
  BOOST_TEST(s->describe().find("pread/pwrite") != std::string::npos, s->describe());
  random_round_trips(*s, 9);
}

BOOST_AUTO_TEST_CASE(io_uring_options_single_submit_and_batches) {
  TempDirs d;
  for (bool single : {true, false}) {
    for (bool overlap : {true, false}) {
      auto o = options(d.two, true, true);
      o.aio.single_submit = single;
      o.aio.overlap_events = overlap;
      std::string skipped;
      auto s = io_uring_storage(o, &skipped);
      if (!s) {
        BOOST_TEST_MESSAGE("skipped: " << skipped);
        return;
      }
      random_round_trips(*s, 13);
    }
  }
}

BOOST_AUTO_TEST_CASE(short_transfers_and_retries_complete_correctly) {
  TempDirs d;
  for (bool uring : {true, false}) {
    int injected_short = 0, injected_retry = 0;
    auto o = options(d.two, uring, true);
    o.fault = [&](bool, const std::string&, uint64_t, size_t len, int64_t& result) {
      if (result <= 0) return;
      static thread_local int n = 0;
      ++n;
      if (n % 3 == 0 && len > 4096) {  // short, by whole 4 KiB blocks as O_DIRECT allows
        result = static_cast<int64_t>(std::max<size_t>(4096, len / 2 / 4096 * 4096));
        ++injected_short;
      } else if (n % 7 == 0) {
        result = n % 2 ? -EINTR : -EAGAIN;  // the request is retried whole
        ++injected_retry;
      }
    };
    auto s = offload::make_storage(o, nullptr);
    if (uring && !dynamic_cast<offload::IoUringStorage*>(s.get())) {
      BOOST_TEST_MESSAGE("io_uring case skipped: the kernel refuses io_uring");
      continue;
    }
    BOOST_TEST(s->describe().find(uring ? "io_uring" : "pread/pwrite") != std::string::npos, s->describe());
    random_round_trips(*s, 17);
    BOOST_TEST(injected_short > 10);
    BOOST_TEST(injected_retry > 5);
  }
}

BOOST_AUTO_TEST_CASE(eio_and_enospc_name_the_path_and_spare_other_data) {
  TempDirs d;
  for (bool uring : {true, false}) {
    for (int err : {EIO, ENOSPC}) {
      bool armed = false;
      auto o = options(d.two, uring, true);
      o.fault = [&](bool, const std::string&, uint64_t, size_t, int64_t& result) {
        if (armed) result = -err;
      };
      auto s = offload::make_storage(o, nullptr);
      if (uring && !dynamic_cast<offload::IoUringStorage*>(s.get())) {
        BOOST_TEST_MESSAGE("io_uring case skipped: the kernel refuses io_uring");
        continue;
      }
      BOOST_TEST(s->describe().find(uring ? "io_uring" : "pread/pwrite") != std::string::npos, s->describe());
      AlignedBuffer good(1 << 20), bad(1 << 20);
      fill(good.p, 0, 1 << 20, 21);
      s->write(0, good.p, 1 << 20);  // the state before the failure
      fill(bad.p, 2 << 20, 1 << 20, 22);
      armed = true;
      try {
        s->write(2 << 20, bad.p, 1 << 20);
        BOOST_FAIL("an injected error was not reported");
      } catch (const StorageError& e) {
        BOOST_TEST(e.err == err);
        BOOST_TEST((e.path == d.two[0] + "/ferry.swp" || e.path == d.two[1] + "/ferry.swp"), e.path);
        BOOST_TEST(std::string(e.what()).find(std::strerror(err)) != std::string::npos, e.what());
        BOOST_TEST(e.offset < (8u << 20));
      }
      armed = false;
      std::memset(good.p, 0, 1 << 20);
      s->read(0, good.p, 1 << 20);
      BOOST_TEST(first_bad(good.p, 0, 1 << 20, 21) == -1);  // earlier data intact
    }
  }
}

// The process-wide seam (base/io_faults.h), which checkpoints and exports also pass
// through, reaches both engines: short transfers and delays chosen by a seed leave every
// byte right; a torn write is reported as EIO naming the file. The seeded plan picks the
// same events for the same seed, other ones for another; FERRY_IO_FAULTS' mistakes are named.
BOOST_AUTO_TEST_CASE(the_fault_seam_reaches_both_engines_and_is_deterministic) {
  TempDirs d;
  for (bool uring : {true, false}) {
    BOOST_TEST_CONTEXT((uring ? "io_uring" : "pread/pwrite")) {
      auto s = offload::make_storage(options(d.two, uring, true), nullptr);
      if (uring && !dynamic_cast<offload::IoUringStorage*>(s.get())) {
        BOOST_TEST_MESSAGE("io_uring case skipped: the kernel refuses io_uring");
        continue;
      }
      {
        auto plan = std::make_shared<SeededIoPlan>(5, 0.3, std::vector<IoFaultKind>{IoFaultKind::short_io, IoFaultKind::delay},
                                                   d.root.string(), 1);
        ScopedIoFaults faults(plan);
        random_round_trips(*s, 31);
        BOOST_TEST(plan->faults() > 10u);
      }
      {
        auto plan = std::make_shared<SeededIoPlan>(5, 1.0, std::vector<IoFaultKind>{IoFaultKind::torn}, d.root.string());
        ScopedIoFaults faults(plan);
        AlignedBuffer buf(1 << 20);
        fill(buf.p, 0, 1 << 20, 3);
        try {
          s->write(0, buf.p, 1 << 20);
          BOOST_FAIL("a torn write was not reported");
        } catch (const StorageError& e) {
          BOOST_TEST(e.err == EIO);
          BOOST_TEST((e.path == d.two[0] + "/ferry.swp" || e.path == d.two[1] + "/ferry.swp"), e.path);
        }
      }
    }
  }
  std::vector<IoEvent> events;
  for (int i = 0; i < 200; ++i) events.push_back({i % 2 ? IoOp::write : IoOp::read, "/x/f" + std::to_string(i % 7), uint64_t(i) * 4096, 4096});
  auto picks = [&](uint64_t seed) {
    SeededIoPlan plan(seed, 0.2, {IoFaultKind::eio, IoFaultKind::torn}, "/x");
    std::string out;
    for (const IoEvent& e : events) out += io_fault_name(plan.decide(e).kind)[0];
    return out;
  };
  BOOST_TEST(picks(1) == picks(1));
  BOOST_TEST(picks(1) != picks(2));
  const std::string p1 = picks(1);
  const auto faulted = std::count_if(p1.begin(), p1.end(), [](char c) { return c != 'n'; });
  BOOST_TEST((faulted > 20 && faulted < 70), faulted << " of 200 at p = 0.2");
  for (const char* bad : {"7", "x:0.1", "7:2", "7:0.1:eio,melt", "7:0.1:eio:/a:b"}) {
    ::setenv("FERRY_IO_FAULTS", bad, 1);
    try {
      install_io_faults_from_env();
      BOOST_FAIL("FERRY_IO_FAULTS=" << bad << " accepted");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(std::string(e.what()).find(std::string("FERRY_IO_FAULTS='") + bad + "'") != std::string::npos, e.what());
    }
  }
  ::unsetenv("FERRY_IO_FAULTS");
  BOOST_TEST(install_io_faults_from_env().empty());
}

BOOST_AUTO_TEST_CASE(bad_folders_and_requests_are_refused_with_the_path) {
  TempDirs d;
  const std::string missing = (d.root / "no_such_folder").string();
  try {
    offload::make_storage(options({missing}, true, true), nullptr);
    BOOST_FAIL("missing folder accepted");
  } catch (const StorageError& e) {
    BOOST_TEST(std::string(e.what()).find(missing) != std::string::npos, e.what());
  }
  auto o = options({d.two[0]}, true, true);
  o.capacity = uint64_t{1} << 60;  // an exabyte: no disk has room
  try {
    offload::make_storage(o, nullptr);
    BOOST_FAIL("too small a disk accepted");
  } catch (const StorageError& e) {
    BOOST_TEST(std::string(e.what()).find("too small") != std::string::npos, e.what());
    BOOST_TEST(e.err == ENOSPC);
  }
  auto s = offload::make_storage(options({d.two[0]}, true, true), nullptr);
  AlignedBuffer b(8192);
  BOOST_CHECK_THROW(s->write(100, b.p, 4096), StorageError);             // unaligned offset
  BOOST_CHECK_THROW(s->write(0, b.p + 1, 4096), StorageError);           // unaligned buffer
  BOOST_CHECK_THROW(s->read(s->capacity(), b.p, 4096), StorageError);    // past the end
  if (geteuid() == 0) {
    BOOST_TEST_MESSAGE("running as root: the unwritable-folder case cannot be made (root writes anywhere)");
  } else {
    const fs::path ro = d.root / "readonly";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    BOOST_CHECK_THROW(offload::make_storage(options({ro.string()}, true, true), nullptr), StorageError);
  }
}

// Requests that complete out of the order they were issued in still land where they
// belong. The reorder is made, not hoped for, and the test asserts that it happened (a
// completion at a lower file offset after one at a higher offset of the same file):
// - pread/pwrite with 2 threads splitting each request: the first piece's completion waits
//   (on a condition the test controls, never a sleep) until a piece at a higher offset of
//   the same file has completed on the other thread;
// - io_uring: the first completion of every fourth piece is made short, so the rest of it
//   is asked again behind the pieces already in flight and completes after them.
BOOST_AUTO_TEST_CASE(delayed_requests_still_complete_in_order) {
  TempDirs d;
  for (bool uring : {true, false}) {
    BOOST_TEST_CONTEXT((uring ? "io_uring" : "pread/pwrite")) {
      std::mutex mu;
      std::condition_variable cv;
      std::vector<std::pair<std::string, uint64_t>> seen;  // completions, in order
      std::set<std::pair<std::string, uint64_t>> shortened;
      bool later_done = false, first_held = false;
      auto o = options(d.two, uring, true);
      o.aio.intra_op_parallelism = 2;
      o.fault = [&](bool, const std::string& path, uint64_t offset, size_t len, int64_t& result) {
        std::unique_lock<std::mutex> lock(mu);
        if (uring) {
          if ((offset / o.aio.block_size) % 4 == 0 && result == static_cast<int64_t>(len) && len >= 8192 &&
              shortened.insert({path, offset}).second) {
            result = static_cast<int64_t>(len / 2 / 4096 * 4096);  // the rest is asked again
          }
        } else if (!first_held && offset == 0) {
          first_held = true;
          // Held until the other thread completes a piece of this file further on.
          BOOST_REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return later_done; }));
        } else if (offset > 0) {
          later_done = true;
          cv.notify_all();
        }
        seen.emplace_back(path, offset);
      };
      std::string skipped;
      std::unique_ptr<offload::Storage> s =
          uring ? io_uring_storage(o, &skipped) : offload::make_storage(o, nullptr);
      if (!s) {
        BOOST_TEST_MESSAGE("skipped: " << skipped);
        continue;
      }
      AlignedBuffer buf(1 << 20);
      fill(buf.p, 0, 1 << 20, 31);
      s->write(0, buf.p, 1 << 20);
      std::memset(buf.p, 0, 1 << 20);
      s->read(0, buf.p, 1 << 20);
      BOOST_TEST(first_bad(buf.p, 0, 1 << 20, 31) == -1);
      int inversions = 0;
      std::map<std::string, uint64_t> highest;
      for (const auto& [path, offset] : seen) {
        auto it = highest.find(path);
        if (it != highest.end() && offset < it->second) ++inversions;
        highest[path] = std::max(highest[path], offset);
      }
      BOOST_TEST_MESSAGE(s->describe() << ": " << inversions << " completions after a later offset's");
      BOOST_TEST(inversions > 0);
    }
  }
}

// The swap files are registered for removal by an abort (base/scratch_files.h) while their
// storage lives, and no longer once it is gone. remove_scratch_files(), what MPI_Abort's
// path and a second stop signal run, unlinks exactly them: a checkpoint beside them stays,
// and the storage, its files still open, keeps working and closes without complaint. The
// table is bounded: past kMaxScratchFiles, or a path longer than kMaxScratchPath, is refused.
BOOST_AUTO_TEST_CASE(swap_files_are_removed_by_an_abort) {
  TempDirs d;
  const std::vector<std::string> swaps = {d.two[0] + "/ferry.swp", d.two[1] + "/ferry.swp"};
  const fs::path keep = fs::path(d.two[0]) / "step-00000001.bin";
  { std::FILE* f = std::fopen(keep.c_str(), "w"); BOOST_REQUIRE(f); std::fclose(f); }
  auto s = offload::make_storage(options(d.two, false, false), nullptr);
  for (const std::string& p : swaps) {
    BOOST_TEST(fs::exists(p), p);
    BOOST_TEST(is_scratch_file(p), p);
  }
  s.reset();
  for (const std::string& p : swaps) {
    BOOST_TEST(!fs::exists(p), p);
    BOOST_TEST(!is_scratch_file(p), p);
  }
  s = offload::make_storage(options(d.two, false, false), nullptr);
  BOOST_TEST(remove_scratch_files() == 2);
  for (const std::string& p : swaps) {
    BOOST_TEST(!fs::exists(p), p);
    BOOST_TEST(!is_scratch_file(p), p);
  }
  BOOST_TEST(fs::exists(keep));
  random_round_trips(*s, 3);  // the open files still hold the data
  s.reset();
  BOOST_TEST(remove_scratch_files() == 0);

  std::vector<std::string> many;
  for (size_t i = 0; i < kMaxScratchFiles; ++i) {
    many.push_back((d.root / ("scratch-" + std::to_string(i))).string());
    std::FILE* f = std::fopen(many.back().c_str(), "w");
    BOOST_REQUIRE(f);
    std::fclose(f);
    BOOST_REQUIRE(register_scratch_file(many.back()));
  }
  BOOST_TEST(!register_scratch_file((d.root / "one-too-many").string()));
  unregister_scratch_file(many[5]);
  BOOST_TEST(!is_scratch_file(many[5]));
  BOOST_TEST(!register_scratch_file(std::string(kMaxScratchPath, 'x')));
  BOOST_TEST(register_scratch_file((d.root / "in-the-freed-slot").string()));  // no such file: not counted
  BOOST_TEST(remove_scratch_files() == static_cast<int>(kMaxScratchFiles) - 1);
  for (size_t i = 0; i < many.size(); ++i) BOOST_TEST(fs::exists(many[i]) == (i == 5), many[i]);
  BOOST_TEST(register_scratch_file(many[5]));  // the table is empty again
  unregister_scratch_file(many[5]);
}

// end_scratch_files(), what the abort paths run: the registered files go, and so does one
// registered afterwards (a rank still opening its swap files when a peer aborts the job).
// In a child process: the ending cannot be undone.
BOOST_AUTO_TEST_CASE(files_registered_after_the_end_go_at_once) {
  TempDirs d;
  const std::string before = (d.root / "before.swp").string(), after = (d.root / "after.swp").string();
  for (const std::string& p : {before, after}) {
    std::FILE* f = std::fopen(p.c_str(), "w");
    BOOST_REQUIRE(f);
    std::fclose(f);
  }
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    // Only the registry, unlink and _exit here: the parent's other threads are not copied.
    int code = register_scratch_file(before) ? 0 : 10;
    end_scratch_files();
    if (::access(before.c_str(), F_OK) == 0) code += 1;
    if (register_scratch_file(after)) code += 2;
    if (::access(after.c_str(), F_OK) == 0) code += 4;
    ::_exit(code);
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_REQUIRE(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);  // 10: not registered; +1, +4: a file left; +2: registered after the end
  BOOST_TEST(!fs::exists(before));
  BOOST_TEST(!fs::exists(after));
}
