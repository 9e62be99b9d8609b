// ferry-bench: the benchmarks (benchmarks/bench_cli.h), which `ferry bench ARGS` runs as
// `ferry-bench ARGS` (examples/ferry.cpp). A program of its own so that the one that
// trains links none of them. Its messages name it "ferry bench", as users call it; exit
// status as bench_cli.h says (0 measured, 1 failed, 2 the command line is wrong).
#include "benchmarks/bench_cli.h"
#include "examples/cli.h"

int main(int argc, char** argv) {
  CLI::App app("ferry bench: the benchmarks; each measures ferry against a reference taken in the same run",
               "ferry bench");
  const ferry::cli::Run run = ferry::bench::bench_command(app);
  return ferry::cli::parse_and_run(app, argc, argv, [&] { return run; });
}
