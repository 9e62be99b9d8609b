#include "runtime/tools/restarts.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "runtime/ckpt/checkpoint.h"
#include "runtime/config/config.h"

namespace ferry::runtime {

namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_child_group = 0;  // the running attempt's process group
volatile sig_atomic_t g_interrupted = 0;

void forward_signal(int sig) {
  g_interrupted = 1;
  if (g_child_group > 0) ::kill(-static_cast<pid_t>(g_child_group), sig);
}

struct TrainSetup {
  std::string config, deepspeed, fsdp;
  std::vector<std::string> overrides;
};

// The few options of ferry train's command line the launcher must read (everything is
// passed on unchanged).
TrainSetup read_train_args(const std::vector<std::string>& args) {
  TrainSetup t;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_next = i + 1 < args.size();
    if (a == "--config" && has_next) t.config = args[++i];
    else if (a == "--deepspeed" && has_next) t.deepspeed = args[++i];
    else if (a == "--fsdp" && has_next) t.fsdp = args[++i];
    else if (a == "--set" && has_next) t.overrides.push_back(args[++i]);
    else if (a == "--resume" && has_next) t.overrides.push_back("checkpoint.resume=" + args[++i]);
  }
  return t;
}

// Runs argv in a process group of its own. Its output (stdout and stderr together) goes to
// std::cout line by line; the last `keep` lines are returned in `tail`. timeout_s > 0: the
// group is killed after that long (status 124). `pids`, when given, gets ferry train's
// startup line naming every rank's pid (it is long gone from the tail when a rank dies).
// Returns the exit status (128 + signal).
int run_child(const std::vector<std::string>& argv, std::vector<std::string>* tail, size_t keep, double timeout_s,
              bool echo, std::string* pids = nullptr) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    std::vector<char*> cargv;
    for (const std::string& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
    cargv.push_back(nullptr);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "ferry launch: cannot run %s: %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no window in which a signal misses the group
  if (echo) g_child_group = pid;
  ::close(fds[1]);
  std::deque<std::string> lines;
  std::string partial;
  const auto start = std::chrono::steady_clock::now();
  bool timed_out = false;
  char buf[65536];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, 200);
    if (ready > 0) {
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) break;  // every writer closed: the job's processes are gone
      if (echo) {
        std::cout.write(buf, n);
        std::cout.flush();
      }
      partial.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = partial.find('\n')) != std::string::npos; partial.erase(0, nl + 1)) {
        lines.push_back(partial.substr(0, nl));
        if (pids && pids->empty() && lines.back().find("| pids: r0=") != std::string::npos) *pids = lines.back();
        if (lines.size() > keep) lines.pop_front();
      }
    }
    if (timeout_s > 0 && !timed_out &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      ::kill(-pid, SIGKILL);
      timed_out = true;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (echo) g_child_group = 0;
  if (!partial.empty()) lines.push_back(partial);
  if (tail) tail->assign(lines.begin(), lines.end());
  if (timed_out) return 124;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> launcher_args(const RestartOptions& r) {
  if (r.launcher_exec.empty()) return {"mpiexec"};
  return {"mpiexec", "-launcher", "ssh", "-launcher-exec", r.launcher_exec};
}

std::string host_list(const std::vector<HostEntry>& hosts, int ranks_per_node, int* world) {
  std::string s;
  *world = 0;
  for (const HostEntry& h : hosts) {
    const int n = h.ranks_or(ranks_per_node);
    s += (s.empty() ? "" : ",") + h.host + ":" + std::to_string(n);
    *world += n;
  }
  return s;
}

}  // namespace

BatchPlan batch_for(int64_t global, int64_t micro, int64_t accum, int world) {
  BatchPlan b{global, micro, accum, true};
  const int64_t per_step = micro * world;
  if (per_step > 0 && global % per_step == 0) {
    b.accum = global / per_step;
  } else {
    b.kept = false;
    b.global = micro * accum * world;
  }
  return b;
}

namespace {

// The number after `key` in `line` (digits only), or "" when `key` is absent.
std::string number_after(const std::string& line, const std::string& key, size_t* end = nullptr) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return "";
  size_t i = at + key.size();
  const size_t first = i;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  if (end) *end = i;
  return line.substr(first, i - first);
}

}  // namespace

std::string failure_cause(const std::vector<std::string>& tail, int status, const std::string& pids) {
  // mpiexec's report of a rank that ended badly: "=   PID 123 RUNNING AT node2" and
  // "=   EXIT CODE: 9" on the next line. (std::regex is avoided: GCC 12's warns in it.)
  for (size_t i = 0; i < tail.size(); ++i) {
    size_t end = 0;
    const std::string pid = number_after(tail[i], "PID ", &end);
    const std::string running = " RUNNING AT ";
    if (pid.empty() || tail[i].compare(end, running.size(), running) != 0) continue;
    const size_t h = end + running.size();
    const std::string host = tail[i].substr(h, tail[i].find_first_of(" \t", h) - h);
    std::string s = "mpiexec: process " + pid + " on " + host;
    const std::string key = "=" + pid;
    for (size_t at = pids.find(key); at != std::string::npos; at = pids.find(key, at + 1)) {
      const size_t after = at + key.size(), r = pids.rfind(" r", at);
      if ((after < pids.size() && pids[after] != ' ') || r == std::string::npos) continue;
      s += " (rank " + pids.substr(r + 2, at - r - 2) + ")";
      break;
    }
    s += " ended";
    if (i + 1 < tail.size()) {
      const std::string code = number_after(tail[i + 1], "EXIT CODE: ");
      if (!code.empty()) s += " with exit code " + code;
    }
    return s;
  }
  for (const std::string& l : tail)
    if (l.find("watchdog:") != std::string::npos) return l.substr(0, 400);
  for (const std::string& l : tail)
    if (l.find("error") != std::string::npos || l.find("Error") != std::string::npos) return l.substr(0, 400);
  return "exit status " + std::to_string(status);
}

int supervise(const LaunchOptions& o, const RestartOptions& r, std::ostream& log) {
  if (r.max_restarts < 0) throw std::invalid_argument("--max-restarts must be at least 0");
  if (o.hosts_file.empty()) throw std::invalid_argument("mpiexec: --hosts FILE is required");
  std::vector<HostEntry> hosts = read_hosts_file(o.hosts_file);
  if (r.min_nodes > static_cast<int>(hosts.size())) {
    throw std::invalid_argument("--min-nodes " + std::to_string(r.min_nodes) + " is more than the " +
                                std::to_string(hosts.size()) + " hosts of " + o.hosts_file);
  }
  int world = 0;
  host_list(hosts, o.ranks_per_node, &world);
  const TrainSetup setup = read_train_args(o.args);
  if (setup.config.empty()) throw std::invalid_argument("ferry train's arguments (after --) need --config FILE");
  Config cfg;
  try {
    cfg = load_config(setup.config, setup.overrides, world, setup.deepspeed, setup.fsdp);
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("config error: ") + e.what());
  }
  if (cfg.checkpoint.dir.empty()) {
    throw std::invalid_argument("--max-restarts resumes from checkpoints: " + setup.config +
                                " sets no checkpoint.dir (add --set checkpoint.dir=DIR --set checkpoint.every_steps=N)");
  }
  if (cfg.checkpoint.every_steps <= 0) {
    log << "ferry launch: checkpoint.every_steps is 0 (a checkpoint only at the end): a restart starts the run over\n";
  }
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  int status = 0;
  std::string cause;
  const int need = r.min_nodes > 0 ? r.min_nodes : static_cast<int>(hosts.size());
  for (int attempt = 0;; ++attempt) {
    // The hosts that answer now. After a failure, once it has settled: a host going down
    // takes a moment to stop answering, a restarted daemon a moment to come back.
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::duration<double>(r.pause_s));
    if (g_interrupted) return status;
    std::vector<HostEntry> alive;
    std::string gone;
    for (const HostEntry& h : hosts) {
      std::vector<std::string> probe = launcher_args(r);
      for (const std::string& a : {std::string("-hosts"), h.host + ":1", std::string("-n"), std::string("1"),
                                   std::string("true")})
        probe.push_back(a);
      if (run_child(probe, nullptr, 0, r.probe_timeout_s, false) == 0) {
        alive.push_back(h);
      } else {
        gone += (gone.empty() ? "" : ", ") + h.host;
      }
    }
    const std::string failed =
        attempt == 0 ? std::string() : "attempt " + std::to_string(attempt) + " failed (" + cause + "), and ";
    if (static_cast<int>(alive.size()) < need) {
      log << "ferry launch: " << failed << alive.size() << " of " << hosts.size() << " hosts answer (not: " << gone
          << "), fewer than " << need
          << (r.min_nodes > 0 ? " (--min-nodes)" : " (every host; --min-nodes allows fewer)") << ": stopping."
          << (attempt > 0 ? " Resume later with --resume auto." : "") << "\n";
      return attempt == 0 ? 1 : status;
    }
    std::vector<std::string> extra;
    std::string change;
    if (attempt > 0) extra = {"--set", "checkpoint.resume=auto"};
    if (alive.size() != hosts.size()) {
      int new_world = 0;
      host_list(alive, o.ranks_per_node, &new_world);
      const BatchPlan b = batch_for(cfg.global_batch(), cfg.micro_batch, cfg.grad_accum, new_world);
      for (const std::string& s : {"train_batch_size=" + std::to_string(b.global),
                                   "gradient_accumulation_steps=" + std::to_string(b.accum)}) {
        extra.emplace_back("--set");
        extra.push_back(s);
      }
      change = "; without " + gone + ": " + std::to_string(new_world) + " ranks, " +
               (b.kept ? "the global batch of " + std::to_string(b.global) + " kept with " + std::to_string(b.accum) +
                             " accumulation steps"
                       : "the global batch changes from " + std::to_string(cfg.global_batch()) + " to " +
                             std::to_string(b.global) + " (it does not divide over the ranks left)");
      // Later restarts keep the smaller world: a host that comes back joins the next job.
      hosts = alive;
      cfg.grad_accum = b.accum;
    }
    if (attempt > 0) {
      std::string latest;
      try {
        latest = resolve_resume("auto", cfg.checkpoint.dir);
      } catch (const std::exception& e) {
        latest = cfg.checkpoint.dir + " (" + e.what() + ")";
      }
      log << "ferry launch: " << failed.substr(0, failed.size() - 6) << "; restarting from "
          << (latest.empty() ? std::string("the beginning (no checkpoint yet)") : latest) << change << "\n";
    } else if (!change.empty()) {
      log << "ferry launch: starting" << change << "\n";
    }
    std::vector<std::string> argv = launcher_args(r);
    const std::string list = host_list(hosts, o.ranks_per_node, &world);
    for (const std::string& a : {std::string("-hosts"), list, std::string("-n"), std::to_string(world), o.program})
      argv.push_back(a);
    if (!o.verb.empty()) argv.push_back(o.verb);
    argv.insert(argv.end(), o.args.begin(), o.args.end());
    const std::vector<std::string> added = launcher_train_args(o);
    argv.insert(argv.end(), added.begin(), added.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    log << "ferry launch: attempt " << attempt + 1 << " of " << r.max_restarts + 1 << ": " << world << " ranks on "
        << list << "\n";
    log.flush();
    std::vector<std::string> tail;
    std::string pids;
    status = run_child(argv, &tail, 64, 0, true, &pids);
    if (status == 0) {
      log << "ferry launch: the job finished" << (attempt > 0 ? " after " + std::to_string(attempt) + " restart(s)" : "")
          << "\n";
      return 0;
    }
    cause = failure_cause(tail, status, pids);
    if (g_interrupted) {
      log << "ferry launch: interrupted; the job ended (" << cause << "), no restart\n";
      return status;
    }
    if (status == 2) {
      log << "ferry launch: the job refused its input (exit status 2: " << cause << "); a restart would too\n";
      return status;
    }
    if (attempt >= r.max_restarts) {
      log << "ferry launch: attempt " << attempt + 1 << " failed (" << cause << "); no restarts left (--max-restarts "
          << r.max_restarts << ")\n";
      return status;
    }
  }
}

}  // namespace ferry::runtime
