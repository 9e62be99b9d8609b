// The emulated GPU behind testing/cuda_emulation.h (tests only, FERRY_CUDA_EMULATION): its
// memory, its streams and events, and the scheduler that runs queued work. Strict by
// design, so that code which is only correct by luck on the emulation fails here:
//
// - Memory: device allocations come from one heap reserved apart from host memory
//   (mmap, PROT_NONE outside the moments when queued work runs), so a host dereference of
//   a device pointer faults with a message naming the address; fresh allocations are
//   poisoned with 0xFF bytes (NaN in every float type); the device has a size (80 GiB,
//   FERRY_EMU_DEVICE_BYTES or set_device_bytes) that cudaMalloc, cudaMallocAsync and
//   cudaMemGetInfo honour. Copies are checked against the allocations they touch.
// - Streams: every operation (kernel, copy, memset, GEMM, collective, event record, event
//   wait) is queued on its stream and runs only when something needs it: a stream or
//   event synchronisation, a copy to pageable host memory, cudaFree, or an event query
//   that decides the device has progressed. What runs then is the needed operations and
//   everything they depend on (stream order and cudaStreamWaitEvent), in an order drawn
//   from a seeded generator among those the dependencies allow, sometimes with unrelated
//   ready work mixed in. So a missing event wait or a host read before a synchronisation
//   changes results instead of passing by luck. FERRY_EMU_SEED picks the seed;
//   FERRY_EMU_EAGER=1 runs every operation at once (the old behaviour, for bisecting).
// - Waits are observable: each cudaStreamWaitEvent records the named ops it made its
//   stream wait for (take_waits), so a test can check that a consumer did not wait for
//   unrelated work.
// - So is the order a GPU would have to keep (set_record_order, take_order): each op's vector
//   clock over the streams, from stream order, event waits and the host's blocking waits
//   (synchronisations, pageable copies back, cudaFree) before its issue; polls are not
//   waits. Two ops neither of which is ordered after the other may run at the same time on
//   a GPU (concurrent): that is how a test shows copies and collectives in flight while
//   kernels run, which the emulation, running one op at a time, cannot show in time.
//
// Thread safety: every entry point takes one process-wide mutex; queued work runs under
// it, except the transport part of a collective (testing/nccl_emulation.h), which releases
// it so that other threads and other ranks make progress meanwhile.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry_emu {

struct Stream;

// One queued operation. `run` executes under the lock with the heap open; `transport`
// (collectives only) runs between `run` and `finish` with the lock released.
struct Op {
  uint64_t id = 0;
  Stream* stream = nullptr;
  std::string what;
  std::vector<uint64_t> deps;  // ops of other streams this one waits for
  std::function<void()> run, transport, finish;
  bool in_flight = false;
};

struct Stream {
  std::string name;
  std::vector<Op*> queue;  // pending, in issue order (front = next)
  size_t head = 0;
  bool destroyed = false;
  Op* front() const { return head < queue.size() ? queue[head] : nullptr; }
};

struct Event {
  unsigned flags = 0;
  uint64_t marker = 0;  // the op that completes it; 0: never recorded (complete)
  double time_ms = 0;   // host time when the marker ran
  int not_ready_answers = 0;
};

struct Allocation {
  size_t bytes = 0;      // rounded up: what the heap gave
  size_t requested = 0;  // what was asked for: copies and kernels' operands must stay inside
};

class Emulator {
 public:
  static Emulator& get() {
    static Emulator* e = new Emulator();  // never destroyed: threads may call in at exit
    return *e;
  }

  std::mutex mu;
  std::condition_variable cv;

  // ---- configuration ----
  void set_seed(uint64_t s) {
    std::lock_guard<std::mutex> lock(mu);
    rng_.seed(s);
    seed_ = s;
  }
  uint64_t seed() const { return seed_; }
  void set_eager(bool e) {
    std::unique_lock<std::mutex> lock(mu);
    if (e) run_all(lock);
    eager_ = e;
  }
  bool eager() const { return eager_; }
  size_t device_bytes() const { return device_bytes_; }
  // Only before the first allocation.
  void set_device_bytes(size_t b) {
    std::lock_guard<std::mutex> lock(mu);
    if (heap_) throw std::logic_error("cuda emulation: the device size is fixed once memory is allocated");
    device_bytes_ = b;
  }

  // ---- memory ----
  void* allocate(size_t bytes) {
    ensure_heap();
    const size_t n = round_up(std::max<size_t>(bytes, 1), 256);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < n) continue;
      const size_t at = it->first, left = it->second - n;
      free_.erase(it);
      if (left) free_[at + n] = left;
      used_[at] = {n, bytes};
      in_use_ += n;
      grow_extent(at + n);
      open();
      std::memset(heap_ + at, 0xFF, n);  // NaN in every float type, -1 in integers
      close();
      return heap_ + at;
    }
    return nullptr;
  }
  bool release(void* p) {
    if (!in_heap(p)) return false;
    const size_t at = static_cast<size_t>(static_cast<char*>(p) - heap_);
    auto u = used_.find(at);
    if (u == used_.end()) return false;
    size_t start = at, len = u->second.bytes;
    in_use_ -= len;
    used_.erase(u);
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + len) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = len;
    return true;
  }
  bool in_heap(const void* p) const {
    return heap_ && p >= heap_ && p < heap_ + device_bytes_;
  }
  // Whether [p, p + n) lies inside one live allocation.
  bool device_range(const void* p, size_t n) const {
    if (!in_heap(p)) return false;
    const size_t at = static_cast<size_t>(static_cast<const char*>(p) - heap_);
    auto it = used_.upper_bound(at);
    if (it == used_.begin()) return false;
    --it;
    return at + n <= it->first + it->second.requested;
  }
  size_t in_use() const { return in_use_; }
  // Host memory from cudaMallocHost or cudaHostRegister.
  std::map<const char*, size_t> pinned;
  bool is_pinned(const void* p) const {
    auto it = pinned.upper_bound(static_cast<const char*>(p));
    if (it == pinned.begin()) return false;
    --it;
    return static_cast<const char*>(p) < it->first + it->second;
  }

  // ---- streams, events, ops ----
  Stream* legacy() { return &legacy_; }
  Stream* new_stream() {
    streams_.push_back(std::make_unique<Stream>());
    streams_.back()->name = "stream " + std::to_string(streams_.size());
    return streams_.back().get();
  }
  // Queues `op` on `s` behind its earlier ops; returns its id. Runs it at once in eager mode.
  uint64_t enqueue(std::unique_lock<std::mutex>& lock, Stream* s, Op op) {
    auto owned = std::make_unique<Op>(std::move(op));
    Op* o = owned.get();
    o->id = ++next_id_;
    o->stream = s;
    if (record_order) order_op(*o);
    std::erase_if(o->deps, [this](uint64_t d) { return done(d); });
    pending_[o->id] = std::move(owned);
    s->queue.push_back(o);
    if (eager_) run_until(lock, o->id, false);
    return o->id;
  }
  bool done(uint64_t id) const { return id == 0 || !pending_.count(id); }
  uint64_t last_of(const Stream* s) const {
    return s->queue.empty() || s->head == s->queue.size() ? 0 : s->queue.back()->id;
  }
  // Runs what op `id` needs and then it. Waits (releasing the lock) for ops other threads
  // have in flight. `host_waits`: the caller blocks the host until `id` has run (a
  // synchronisation), so what the host issues next is ordered after it.
  void run_until(std::unique_lock<std::mutex>& lock, uint64_t id, bool host_waits = true) {
    while (!done(id)) {
      std::unordered_map<Stream*, uint64_t> need;  // per stream: run its queue up to this id
      collect(id, need);
      std::vector<Op*> ready, extra;
      bool blocked = false;
      for (auto& [s, upto] : need) {
        Op* f = s->front();
        if (!f || f->id > upto) continue;
        if (f->in_flight) { blocked = true; continue; }
        if (std::all_of(f->deps.begin(), f->deps.end(), [this](uint64_t d) { return done(d); }))
          ready.push_back(f);
      }
      if (ready.empty()) {
        if (!blocked) throw std::logic_error("cuda emulation: queued work waits for itself (op " + std::to_string(id) + ")");
        cv.wait(lock);
        continue;
      }
      Op* pick = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng_)];
      // Now and then a ready op nobody asked for runs first, as a real GPU runs whatever
      // is ready: orders a missing wait would allow then happen.
      if (std::uniform_int_distribution<int>(0, 7)(rng_) == 0) {
        for (auto& s : streams_)
          if (Op* f = s->front(); f && !f->in_flight && !need.count(s.get()) &&
              std::all_of(f->deps.begin(), f->deps.end(), [this](uint64_t d) { return done(d); }))
            extra.push_back(f);
        if (!extra.empty()) pick = extra[std::uniform_int_distribution<size_t>(0, extra.size() - 1)(rng_)];
      }
      execute(lock, pick);
    }
    if (host_waits) host_saw(id);
  }
  void run_stream(std::unique_lock<std::mutex>& lock, Stream* s) { run_until(lock, last_of(s)); }
  void run_all(std::unique_lock<std::mutex>& lock) {
    while (!pending_.empty()) run_until(lock, pending_.begin()->first);
    if (record_order)
      for (auto& [stream, clock] : tail_) merge(host_, clock);
  }
  // A query from a thread that polls: the device progresses by itself on a GPU, so here
  // an unfinished op is finished after a seeded number of "not ready" answers (at most 4).
  // A test can stall the device (queries answer "not ready"; synchronisations still run
  // what they need), to look at what is queued without a poller finishing it.
  bool stalled = false;
  bool progressed(std::unique_lock<std::mutex>& lock, uint64_t id, int& answers) {
    // A poll is no host wait: the code that polls goes on either way, and on a GPU the
    // answer "done" comes only once the device got there, while here it comes after a few
    // answers; so it orders nothing the host issues next.
    if (done(id)) return true;
    if (stalled) return false;
    if (answers < 4 && std::uniform_int_distribution<int>(0, 2)(rng_) != 0) {
      ++answers;
      return false;
    }
    answers = 0;
    run_until(lock, id, false);
    return true;
  }
  // ---- the order a GPU keeps (tests; off by default) ----
  // Per stream, the last op of that stream an op is ordered after (ids grow in issue
  // order, so that op and every earlier one of its stream).
  using Clock = std::unordered_map<const Stream*, uint64_t>;
  struct Ordered {
    uint64_t id = 0;
    std::string what;
    const Stream* stream = nullptr;
    Clock after;
  };
  // Starts (clearing what was kept) or stops keeping clocks; ops issued while it is off
  // are ordered after nothing, so turn it on before the work to look at is issued.
  void set_record_order(bool on) {
    std::lock_guard<std::mutex> lock(mu);
    record_order = on;
    clocks_.clear();
    tail_.clear();
    host_.clear();
    ordered_.clear();
    host_waits_ = 0;
  }
  // Whether a GPU may run `a` and `b` at the same time: neither is ordered after the other.
  static bool concurrent(const Ordered& a, const Ordered& b) {
    auto after = [](const Ordered& x, const Ordered& y) {  // x is ordered after y
      auto it = x.after.find(y.stream);
      return it != x.after.end() && it->second >= y.id;
    };
    return a.stream != b.stream && !after(a, b) && !after(b, a);
  }
  // The named ops issued since the last call, with their clocks.
  std::vector<Ordered> take_order() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(ordered_, {});
  }
  // The host's blocking waits since the last call (while keeping clocks).
  size_t take_host_waits() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(host_waits_, 0);
  }
  // cudaStreamWaitEvent: what `waiting` issues next is ordered after `marker`, whether or
  // not the emulation has run it already (a GPU keeps the order either way).
  void order_wait(const Stream* waiting, uint64_t marker) {
    if (!record_order || marker == 0) return;
    if (auto it = clocks_.find(marker); it != clocks_.end()) merge(tail_[waiting], it->second);
  }
  // cudaStreamWaitEvent records what the waiting stream now waits for: the unfinished
  // named ops of the event's stream up to its marker (markers have no name).
  struct Wait {
    std::string stream;
    std::vector<std::string> ops;
  };
  bool record_waits = false;  // off by default: long runs would keep every record
  void note_wait(const Stream* waiting, uint64_t marker) {
    if (!record_waits) return;
    auto it = pending_.find(marker);
    if (it == pending_.end()) return;
    const Stream* s = it->second->stream;
    Wait w{waiting->name, {}};
    for (size_t i = s->head; i < s->queue.size() && s->queue[i]->id <= marker; ++i)
      if (!s->queue[i]->what.empty()) w.ops.push_back(s->queue[i]->what);
    waits_.push_back(std::move(w));
  }
  // The waits recorded since the last call.
  std::vector<Wait> take_waits() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(waits_, {});
  }
  Event* new_event(unsigned flags) {
    events_.push_back(std::make_unique<Event>());
    events_.back()->flags = flags;
    return events_.back().get();
  }

  // ---- limits ----
  static constexpr size_t kSharedDefault = 48 * 1024, kSharedOptin = 232448;  // H100
  // What the context, cuBLAS and NCCL take before ferry allocates: cudaMemGetInfo's free
  // memory starts this much below the device size.
  static constexpr size_t kContextBytes = size_t{512} << 20;
  std::unordered_map<const void*, int> max_dynamic_shared;  // per kernel, after opt-in

  // ---- errors ----
  int last_error = 0;

 private:
  Emulator() {
    if (const char* s = std::getenv("FERRY_EMU_SEED")) seed_ = std::strtoull(s, nullptr, 10);
    rng_.seed(seed_);
    if (const char* e = std::getenv("FERRY_EMU_EAGER")) eager_ = std::string(e) == "1";
    if (const char* b = std::getenv("FERRY_EMU_DEVICE_BYTES")) device_bytes_ = std::strtoull(b, nullptr, 10);
    legacy_.name = "the legacy default stream";
  }
  static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

  void ensure_heap() {
    if (heap_) return;
    void* p = mmap(nullptr, device_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda emulation: cannot reserve the device heap");
    madvise(p, device_bytes_, MADV_HUGEPAGE);  // fewer page-table entries to re-protect
    heap_ = static_cast<char*>(p);
    if (device_bytes_ <= kContextBytes) throw std::logic_error("cuda emulation: device size below the context's reserve");
    free_[0] = device_bytes_ - kContextBytes;
    heap_begin_ = heap_;
    heap_end_ = heap_ + device_bytes_;
    struct sigaction sa{};
    sa.sa_sigaction = &Emulator::on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, &previous_segv_);
  }
  void grow_extent(size_t end) {
    const size_t page = 2u << 20;
    extent_ = std::max(extent_, round_up(end, page));
  }
  void open() {
    if (open_++ == 0 && extent_) mprotect(heap_, extent_, PROT_READ | PROT_WRITE);
  }
  void close() {
    if (--open_ == 0 && extent_) mprotect(heap_, extent_, PROT_NONE);
  }
  static void on_fault(int sig, siginfo_t* info, void* ctx) {
    const char* a = static_cast<const char*>(info->si_addr);
    if (a >= heap_begin_ && a < heap_end_) {
      char msg[160];
      const int n = std::snprintf(msg, sizeof msg,
                                  "cuda emulation: the host touched device memory at %p outside a "
                                  "kernel or a copy (a device pointer dereferenced on the host)\n",
                                  static_cast<const void*>(a));
      if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
      signal(SIGSEGV, SIG_DFL);  // the access repeats and ends the process with SIGSEGV
      return;
    }
    if (previous_segv_.sa_flags & SA_SIGINFO) {
      if (previous_segv_.sa_sigaction) return previous_segv_.sa_sigaction(sig, info, ctx);
    } else if (previous_segv_.sa_handler != SIG_DFL && previous_segv_.sa_handler != SIG_IGN) {
      return previous_segv_.sa_handler(sig);
    }
    signal(SIGSEGV, SIG_DFL);
  }

  static void merge(Clock& into, const Clock& from) {
    for (const auto& [s, id] : from) into[s] = std::max(into[s], id);
  }
  // The host has seen `id` finish: whatever it issues from now on is ordered after it.
  void host_saw(uint64_t id) {
    if (!record_order) return;
    ++host_waits_;
    if (auto it = clocks_.find(id); it != clocks_.end()) merge(host_, it->second);
  }
  void order_op(const Op& o) {
    Clock c = tail_[o.stream];
    merge(c, host_);
    for (uint64_t d : o.deps)
      if (auto it = clocks_.find(d); it != clocks_.end()) merge(c, it->second);
    c[o.stream] = o.id;
    tail_[o.stream] = c;
    if (!o.what.empty()) ordered_.push_back({o.id, o.what, o.stream, c});
    clocks_[o.id] = std::move(c);
  }

  void collect(uint64_t id, std::unordered_map<Stream*, uint64_t>& need) {
    std::vector<uint64_t> todo{id};
    while (!todo.empty()) {
      const uint64_t t = todo.back();
      todo.pop_back();
      auto it = pending_.find(t);
      if (it == pending_.end()) continue;
      Stream* s = it->second->stream;
      uint64_t& upto = need[s];
      if (upto >= t) continue;
      for (size_t i = s->head; i < s->queue.size() && s->queue[i]->id <= t; ++i) {
        if (s->queue[i]->id <= upto) continue;
        for (uint64_t d : s->queue[i]->deps) todo.push_back(d);
      }
      upto = t;
    }
  }
  void execute(std::unique_lock<std::mutex>& lock, Op* o) {
    o->in_flight = true;
    open();
    try {
      if (o->run) o->run();
      if (o->transport) {
        close();
        lock.unlock();
        try {
          o->transport();
        } catch (...) {
          lock.lock();
          open();
          throw;
        }
        lock.lock();
        open();
      }
      if (o->finish) o->finish();
    } catch (...) {
      close();
      o->in_flight = false;
      throw;
    }
    close();
    Stream* s = o->stream;
    ++s->head;
    if (s->head == s->queue.size()) {
      s->queue.clear();
      s->head = 0;
    }
    pending_.erase(o->id);
    cv.notify_all();
  }

  uint64_t seed_ = 1;
  std::mt19937_64 rng_;
  bool eager_ = false;
  size_t device_bytes_ = size_t{80} << 30;
  char* heap_ = nullptr;
  size_t extent_ = 0;
  int open_ = 0;
  std::map<size_t, size_t> free_;  // offset -> bytes
  std::map<size_t, Allocation> used_;
  size_t in_use_ = 0;
  Stream legacy_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::unique_ptr<Event>> events_;
  std::map<uint64_t, std::unique_ptr<Op>> pending_;
  std::vector<Wait> waits_;
  std::unordered_map<uint64_t, Clock> clocks_;  // every op's, while record_order
  std::unordered_map<const Stream*, Clock> tail_;  // what the next op of a stream is ordered after
  Clock host_;                                   // what the host has seen finish
  size_t host_waits_ = 0;
  std::vector<Ordered> ordered_;
  bool record_order = false;
  uint64_t next_id_ = 0;
  static inline const char* heap_begin_ = nullptr;
  static inline const char* heap_end_ = nullptr;
  static inline struct sigaction previous_segv_{};
};

}  // namespace ferry_emu
