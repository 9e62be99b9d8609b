// Diagnostic lines on stderr, each prefixed with where it came from:
//   [ferry node7:41233 r3 WARN offload] optimizer state: ...
// (host, pid, rank, level, subsystem), so that the merged stderr of a multi-node job says
// which process wrote what. The training report itself (step lines, the state table) goes
// to rank 0's stdout and is not a log.
//
// Environment (read once, at first use; --help-config lists them):
//   FERRY_LOG         error | warn (default) | info | debug | trace: the most detailed
//                     level printed. info: what each part set up and where (storage files,
//                     pools, communicator, checkpoints); debug: per step; trace: per unit.
//   FERRY_LOG_SUBSYS  comma-separated subsystems whose info/debug/trace lines print
//                     (default all; "^name" excludes one): init, config, comm, offload,
//                     sched, optim, ckpt, train. Warnings and errors always print.
// A value it cannot read is reported once (naming the variable) and the default is used.
// Thread safety: every function may be called from any thread; each line is written with
// one write(2), so lines of concurrent threads and ranks do not interleave mid-line.
#pragma once

#include <string>

namespace ferry::log {

enum class Level { error, warn, info, debug, trace };
enum class Subsys { init, config, comm, offload, sched, optim, ckpt, train };
constexpr int kSubsystems = 8;

// Sets the rank shown in the prefix (before it is called, "r?").
void set_rank(int rank);
// Re-reads the settings from these values instead of the environment (tests, tools);
// returns what it could not read ("" when all was understood).
std::string configure(const std::string& level, const std::string& subsys);
bool enabled(Level level, Subsys subsys);
// Writes `message` (several lines: each prefixed) if enabled(level, subsys).
void write(Level level, Subsys subsys, const std::string& message);
// The prefixed text write() would produce, ending in '\n'.
std::string format(Level level, Subsys subsys, const std::string& message);
const char* subsys_name(Subsys s);
const char* level_name(Level l);

inline void error(Subsys s, const std::string& m) { write(Level::error, s, m); }
inline void warn(Subsys s, const std::string& m) { write(Level::warn, s, m); }
inline void info(Subsys s, const std::string& m) { write(Level::info, s, m); }
inline void debug(Subsys s, const std::string& m) { write(Level::debug, s, m); }
inline void trace(Subsys s, const std::string& m) { write(Level::trace, s, m); }

}  // namespace ferry::log
