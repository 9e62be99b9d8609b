#include "runtime/tools/plot.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "base/nesting_limit.h"

namespace ferry::runtime {

using nlohmann::json;

MetricsSeries read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the metrics file");
  struct StepRow {
    double loss, tokens_per_s, tflops;
  };
  std::map<double, StepRow> steps;
  std::map<double, double> evals;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(n);
    const json j = base::parse_json<std::runtime_error>(line, where, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) throw std::runtime_error(where + ": not a JSON object");
    if (!j.contains("step") || !j["step"].is_number()) throw std::runtime_error(where + ": no \"step\" number");
    const double step = j["step"].get<double>();
    if (j.contains("val_loss")) {
      evals[step] = j["val_loss"].get<double>();
    } else if (j.contains("loss")) {
      if (!j["loss"].is_number() || !j.value("tokens_per_s", json()).is_number()) {
        throw std::runtime_error(where + ": a step record needs numbers \"loss\" and \"tokens_per_s\"");
      }
      steps[step] = {j["loss"].get<double>(), j["tokens_per_s"].get<double>(),
                     j.contains("tflops") ? j["tflops"].get<double>() : -1.0};
    }
  }
  if (steps.empty()) throw std::runtime_error(path + ": no step records (lines with \"step\" and \"loss\")");
  MetricsSeries m;
  for (const auto& [s, r] : steps) {
    m.step.push_back(s);
    m.loss.push_back(r.loss);
    m.tokens_per_s.push_back(r.tokens_per_s);
    m.tflops.push_back(r.tflops);
  }
  for (const auto& [s, v] : evals) m.eval_step.push_back(s), m.val_loss.push_back(v);
  return m;
}

std::string gnuplot_script(const MetricsSeries& m, const std::string& png, const std::string& title) {
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return q + "\"";
  };
  const bool have_tflops = !m.tflops.empty() && m.tflops.back() >= 0;
  std::ostringstream os;
  os.precision(10);
  os << "$steps << EOD\n";
  for (size_t i = 0; i < m.step.size(); ++i) {
    os << m.step[i] << " " << m.loss[i] << " " << m.tokens_per_s[i] << " " << m.tflops[i] << "\n";
  }
  os << "EOD\n$evals << EOD\n";
  for (size_t i = 0; i < m.eval_step.size(); ++i) os << m.eval_step[i] << " " << m.val_loss[i] << "\n";
  os << "EOD\n"
     << "set terminal pngcairo size 1200,800 font ',10'\n"
     << "set output " << quoted(png) << "\n"
     << "set multiplot layout 2,1 title " << quoted(title) << "\n"
     << "set grid\nset key top right\nset xlabel 'step'\nset ylabel 'loss (nats/token)'\n"
     << "plot $steps using 1:2 with lines lw 1.5 title 'training loss'"
     << (m.eval_step.empty() ? "" : ", $evals using 1:2 with linespoints pt 7 lw 2 title 'validation loss'") << "\n"
     << "set ylabel 'tokens/s'\n";
  if (have_tflops) {
    os << "set y2label 'TFLOP/s'\nset y2tics\nset ytics nomirror\n"
       << "plot $steps using 1:3 with lines title 'tokens/s', $steps using 1:4 axes x1y2 with lines title 'TFLOP/s'\n";
  } else {
    os << "plot $steps using 1:3 with lines title 'tokens/s'\n";
  }
  os << "unset multiplot\nset output\n";
  return os.str();
}

void run_gnuplot(const std::string& script, const std::string& png) {
  FILE* gp = ::popen("gnuplot 2>&1", "w");
  if (!gp) throw std::runtime_error("cannot start gnuplot");
  std::fwrite(script.data(), 1, script.size(), gp);
  const int status = ::pclose(gp);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) == 127) {
    throw std::runtime_error("gnuplot is not installed (Debian: apt-get install gnuplot-nox; scripts/setup.sh does)");
  }
  if (WEXITSTATUS(status) != 0) {
    throw std::runtime_error("gnuplot failed (status " + std::to_string(WEXITSTATUS(status)) + ") drawing " + png);
  }
  std::ifstream out(png, std::ios::binary);
  char magic[8] = {};
  if (!out.read(magic, 8) || std::string(magic + 1, 3) != "PNG") {
    throw std::runtime_error("gnuplot wrote no PNG to " + png);
  }
}

}  // namespace ferry::runtime
