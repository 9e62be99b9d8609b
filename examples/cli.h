// The command line of ferry's programs: every verb is a CLI11 (sub)command, and
// parse_and_run turns its outcome into the exit-status contract every program keeps:
//   0 done (and --help), 1 the input was refused or the run failed, 2 the command line is wrong.
// A parse error (an unknown option or verb, a number that does not parse, a missing value)
// prints "PROGRAM: MESSAGE" naming the option and exits 2; no value silently becomes 0.
// Not thread-safe (argument parsing happens once, in main, before any thread starts).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry::cli {

// What a verb does once its command line has parsed; returns the exit status.
using Run = std::function<int()>;

// A command-line mistake a verb finds after parsing (a required option missing, options that
// do not go together, a byte size that does not parse): parse_and_run prints it, exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv into `app`, then calls the Run that `chosen` returns (the selected verb's).
// --help prints the help of the (sub)command it follows on stdout and returns 0; errors go
// to stderr. Under mpiexec only rank 0 prints help and errors: every rank parses the same
// argv and reads the same files, and would print the same text.
// The one mapping from what a verb throws to the exit status, "PROGRAM VERB: ..." on stderr:
//   UsageError                -> 2, with the --help hint
//   runtime::ConfigError      -> 2, "config error: MESSAGE" (a file, key or value refused)
//   runtime::CheckpointError  -> 1, "checkpoint refused: MESSAGE" (unless reported already)
//   any other std::exception  -> 1, the message
// A verb catches only what it must handle itself (train: a failure on one rank of many ends
// the job through MPI, naming the rank).
int parse_and_run(CLI::App& app, int argc, char** argv, const std::function<Run()>& chosen);

// True in a process mpiexec started as a rank other than 0 (read from the environment
// before MPI is initialised).
bool secondary_rank();

// Validators for whole-number options: the value must be all digits and at least `min`
// ("--ranks: 'abc' is not a whole number >= 1"); the option's own type catches overflow.
CLI::Validator at_least(long min);

// The options that name a run's configuration, shared by train, plan and doctor.
struct RunOptions {
  std::string config, deepspeed, fsdp;  // fsdp: a file, or the Trainer's --fsdp string
  std::vector<std::string> sets;  // --set key=value, in command-line order
  int ranks = 1;                  // plan and doctor only (train takes its world size from MPI)
};
// Adds --config, --deepspeed, --fsdp and a repeatable --set KEY=VALUE to `cmd`; --ranks N (>= 1)
// as well when `with_ranks`. `o` must outlive the parse.
void add_run_options(CLI::App& cmd, RunOptions& o, bool with_ranks);

}  // namespace ferry::cli
