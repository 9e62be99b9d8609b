#include "base/stop_signal.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "base/scratch_files.h"

namespace ferry {

namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};  // CLOCK_MONOTONIC time of the first signal

int64_t now_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void say(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, s, n);
}

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    // One stop request often arrives twice: Slurm signals every process of the step and
    // mpiexec forwards its own copy to the ranks; timeout(1) signals its child and then
    // its process group. Only a signal sent later on purpose means "now".
    if (now_ns() - g_first_ns.load() < kDuplicateWindowNs) return;
    say("ferry: second stop signal: exiting now, without a checkpoint\n");
    end_scratch_files();  // _exit skips the swap files' destructors (unlink is signal-safe)
    ::_exit(128 + sig);
  }
  g_first_ns.store(now_ns());
  say(sig == SIGINT ? "ferry: SIGINT: stopping after this step with a checkpoint (again, 2 s later, to exit at once)\n"
                    : "ferry: SIGTERM: stopping after this step with a checkpoint (again, 2 s later, to exit at once)\n");
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_signal.load(); }

void request_stop(int signal) {
  g_first_ns.store(now_ns());
  g_signal.store(signal);
}

}  // namespace ferry
