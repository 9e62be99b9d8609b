#include "base/log.h"

#include "base/env.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace ferry::log {

namespace {

constexpr const char* kSubsysNames[kSubsystems] = {"init", "config", "comm", "offload", "sched", "optim", "ckpt", "train"};
constexpr const char* kLevelNames[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

struct Settings {
  Level level = Level::warn;
  bool subsys[kSubsystems] = {true, true, true, true, true, true, true, true};
  std::string problems;  // reported once, after parsing
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Settings parse(const std::string& level, const std::string& subsys) {
  Settings s;
  if (!level.empty()) {
    const std::string l = lower(level);
    bool found = false;
    for (int i = 0; i < 5; ++i) {
      if (l == lower(kLevelNames[i])) s.level = static_cast<Level>(i), found = true;
    }
    if (!found) s.problems += "FERRY_LOG='" + level + "' is not one of error, warn, info, debug, trace; using warn. ";
  }
  if (!subsys.empty() && lower(subsys) != "all") {
    std::stringstream list(subsys);
    std::string item;
    bool any_included = false;
    bool include[kSubsystems] = {};
    bool exclude[kSubsystems] = {};
    while (std::getline(list, item, ',')) {
      const bool neg = !item.empty() && item[0] == '^';
      const std::string name = lower(neg ? item.substr(1) : item);
      int idx = -1;
      for (int i = 0; i < kSubsystems; ++i)
        if (name == kSubsysNames[i]) idx = i;
      if (idx < 0) {
        s.problems += "FERRY_LOG_SUBSYS: unknown subsystem '" + item +
                      "' (init, config, comm, offload, sched, optim, ckpt, train). ";
        continue;
      }
      (neg ? exclude : include)[idx] = true;
      any_included |= !neg;
    }
    for (int i = 0; i < kSubsystems; ++i) s.subsys[i] = (any_included ? include[i] : true) && !exclude[i];
  }
  return s;
}

std::mutex mu;
Settings* settings = nullptr;  // guarded by mu until set; read-only afterwards except configure()
std::atomic<int> rank_shown{-1};

const Settings& current() {
  std::lock_guard<std::mutex> lock(mu);
  if (!settings) {
    const char* l = env_value("FERRY_LOG");
    const char* s = env_value("FERRY_LOG_SUBSYS");
    settings = new Settings(parse(l ? l : "", s ? s : ""));  // lives until exit: logged from exit paths too
    if (!settings->problems.empty()) {
      const std::string line = format(Level::warn, Subsys::init, settings->problems.substr(0, settings->problems.size() - 1));
      (void)!::write(2, line.data(), line.size());
    }
  }
  return *settings;
}

std::string host_name() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return host;
}

}  // namespace

const char* subsys_name(Subsys s) { return kSubsysNames[static_cast<int>(s)]; }
const char* level_name(Level l) { return kLevelNames[static_cast<int>(l)]; }

void set_rank(int rank) { rank_shown.store(rank); }

std::string configure(const std::string& level, const std::string& subsys) {
  Settings fresh = parse(level, subsys);
  std::lock_guard<std::mutex> lock(mu);
  if (!settings) settings = new Settings();
  *settings = fresh;
  return fresh.problems;
}

bool enabled(Level level, Subsys subsys) {
  const Settings& s = current();
  if (level <= Level::warn) return true;
  return level <= s.level && s.subsys[static_cast<int>(subsys)];
}

std::string format(Level level, Subsys subsys, const std::string& message) {
  static const std::string host = host_name();
  const int r = rank_shown.load();
  std::string prefix = "[ferry " + host + ":" + std::to_string(getpid()) + " r" + (r < 0 ? "?" : std::to_string(r)) +
                       " " + level_name(level) + " " + subsys_name(subsys) + "] ";
  std::string out;
  std::stringstream lines(message);
  std::string line;
  while (std::getline(lines, line)) out += prefix + line + "\n";
  if (out.empty()) out = prefix + "\n";
  return out;
}

void write(Level level, Subsys subsys, const std::string& message) {
  if (!enabled(level, subsys)) return;
  const std::string text = format(level, subsys, message);
  (void)!::write(2, text.data(), text.size());  // one call: whole lines, even across threads
}

}  // namespace ferry::log
