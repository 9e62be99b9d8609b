#include "runtime/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace ferry::runtime {

namespace {

std::atomic<int> g_signal{0};

void say(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, s, n);
}

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    say("ferry: second stop signal: exiting now, without a checkpoint\n");
    ::_exit(128 + sig);
  }
  say(sig == SIGINT ? "ferry: SIGINT: stopping after this step with a checkpoint (again to exit at once)\n"
                    : "ferry: SIGTERM: stopping after this step with a checkpoint (again to exit at once)\n");
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

void request_stop(int signal) { g_signal.store(signal); }

}  // namespace ferry::runtime
