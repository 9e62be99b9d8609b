// ferry plot METRICS.jsonl -o run.png [--title TEXT] [--script FILE.gp]
// Loss and throughput curves of a metrics file, drawn by gnuplot (runtime/tools/plot.h);
// --script also keeps the gnuplot program (with its data) in FILE.gp. Exit status: 0
// drawn; 1 the metrics were refused or gnuplot failed; 2 the command line is wrong.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "runtime/tools/plot.h"

namespace ferry::cli {

namespace {

struct PlotArgs {
  std::string metrics, png, title, script_path;
};

int plot(const PlotArgs& a) {
  const runtime::MetricsSeries m = runtime::read_metrics(a.metrics);
  const std::string script = runtime::gnuplot_script(m, a.png, a.title.empty() ? a.metrics : a.title);
  if (!a.script_path.empty()) std::ofstream(a.script_path) << script;
  runtime::run_gnuplot(script, a.png);
  std::cout << "plotted " << m.step.size() << " steps and " << m.eval_step.size() << " evaluations of " << a.metrics
            << " -> " << a.png << "\n";
  return 0;
}

}  // namespace

Run plot_command(CLI::App& cmd) {
  auto a = std::make_shared<PlotArgs>();
  cmd.description("draw the loss and throughput curves of a metrics file (log.metrics) with gnuplot");
  cmd.add_option("metrics", a->metrics, "the metrics file (JSON lines) a run wrote")->required();
  cmd.add_option("-o,--out", a->png, "the PNG to draw")->required();
  cmd.add_option("--title", a->title, "the plot's title (default: the metrics file's name)");
  cmd.add_option("--script", a->script_path, "also keep the gnuplot program, with its data, in this file");
  return [a] { return plot(*a); };
}

}  // namespace ferry::cli
