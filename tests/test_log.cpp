// Diagnostic logging: the prefix (host, pid, rank, level, subsystem), FERRY_LOG levels and
// FERRY_LOG_SUBSYS filters, and values it cannot read; the environment variables' one list
// (base/env.h).
#define BOOST_TEST_MODULE log
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdlib>
#include <set>
#include <stdexcept>

#include "base/env.h"
#include "base/log.h"

using namespace ferry;
using log::Level;
using log::Subsys;

BOOST_AUTO_TEST_CASE(prefix_names_host_pid_rank_level_subsystem) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  log::set_rank(-1);
  const std::string before = log::format(Level::warn, Subsys::offload, "x");
  BOOST_TEST(before == "[ferry " + std::string(host) + ":" + std::to_string(getpid()) + " r? WARN offload] x\n");
  log::set_rank(3);
  // Every line of a multi-line message carries the prefix: merged stderr stays attributable.
  const std::string two = log::format(Level::error, Subsys::comm, "first\nsecond");
  const std::string p = "[ferry " + std::string(host) + ":" + std::to_string(getpid()) + " r3 ERROR comm] ";
  BOOST_TEST(two == p + "first\n" + p + "second\n");
}

BOOST_AUTO_TEST_CASE(levels) {
  BOOST_TEST(log::configure("", "") == "");
  BOOST_TEST(log::enabled(Level::warn, Subsys::sched));   // default: warn
  BOOST_TEST(!log::enabled(Level::info, Subsys::sched));
  BOOST_TEST(log::configure("INFO", "") == "");  // case does not matter
  BOOST_TEST(log::enabled(Level::info, Subsys::ckpt));
  BOOST_TEST(!log::enabled(Level::debug, Subsys::ckpt));
  log::configure("trace", "");
  BOOST_TEST(log::enabled(Level::trace, Subsys::train));
  log::configure("error", "");
  BOOST_TEST(log::enabled(Level::warn, Subsys::train));  // warnings and errors always print
  BOOST_TEST(log::enabled(Level::error, Subsys::train));
  BOOST_TEST(!log::enabled(Level::info, Subsys::train));
}

BOOST_AUTO_TEST_CASE(subsystems) {
  log::configure("debug", "comm,offload");
  BOOST_TEST(log::enabled(Level::debug, Subsys::comm));
  BOOST_TEST(log::enabled(Level::info, Subsys::offload));
  BOOST_TEST(!log::enabled(Level::info, Subsys::sched));
  BOOST_TEST(log::enabled(Level::warn, Subsys::sched));
  log::configure("debug", "^comm");  // all but comm
  BOOST_TEST(!log::enabled(Level::debug, Subsys::comm));
  BOOST_TEST(log::enabled(Level::debug, Subsys::ckpt));
  log::configure("info", "ALL");
  BOOST_TEST(log::enabled(Level::info, Subsys::init));
}

BOOST_AUTO_TEST_CASE(unreadable_values_fall_back_and_say_so) {
  const std::string bad_level = log::configure("verbose", "");
  BOOST_TEST(bad_level.find("FERRY_LOG='verbose' is not one of error, warn, info, debug, trace") != std::string::npos);
  BOOST_TEST(!log::enabled(Level::info, Subsys::comm));  // warn
  const std::string bad_subsys = log::configure("info", "comm,nccl");
  BOOST_TEST(bad_subsys.find("FERRY_LOG_SUBSYS: unknown subsystem 'nccl'") != std::string::npos);
  BOOST_TEST(log::enabled(Level::info, Subsys::comm));  // the names it knows still apply
  BOOST_TEST(!log::enabled(Level::info, Subsys::optim));
  log::configure("", "");
}

BOOST_AUTO_TEST_CASE(environment_variables_are_read_only_where_declared) {
  std::set<std::string> names;
  for (const EnvVariable& v : environment_variables()) {
    BOOST_TEST(names.insert(v.name).second, v.name << " declared twice");
    BOOST_TEST(!v.description.empty());
  }
  BOOST_TEST(names.count("FERRY_LOG") == 1);
  BOOST_TEST(names.count("FERRY_IO_FAULTS") == 1);
  BOOST_CHECK_THROW(env_value("FERRY_NOT_DECLARED"), std::logic_error);
  ::setenv("FERRY_FAULT_KILL_IN_CHECKPOINT", "3:7", 1);
  BOOST_TEST(std::string(env_value("FERRY_FAULT_KILL_IN_CHECKPOINT")) == "3:7");
  ::unsetenv("FERRY_FAULT_KILL_IN_CHECKPOINT");
  BOOST_TEST(env_value("FERRY_FAULT_KILL_IN_CHECKPOINT") == nullptr);
}
