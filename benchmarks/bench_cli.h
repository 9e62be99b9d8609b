// ferry bench <name> [options]: the benchmarks as a verb of `ferry`, run by the program
// ferry-bench (examples/ferry_bench.cpp) that `ferry bench` starts.
// Each benchmark measures ferry against a reference taken in the same run on the same
// machine, prints a table and a headline ratio, and with --json writes the result.
// Exit status: 0 measured; 1 the benchmark failed (or found ferry wrong); 2 the command
// line is wrong (reported by CLI11 through the caller's parse).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace ferry::bench {

// Adds one sub-command per benchmark (model, comm, adam, io, ckpt, step) with its options
// to `cmd`, which the caller owns and keeps alive; returns what runs the chosen one once the
// command line has parsed. Options are held by the returned function.
std::function<int()> bench_command(CLI::App& cmd);

}  // namespace ferry::bench
