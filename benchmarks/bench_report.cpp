#include "benchmarks/bench_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <utility>

namespace ferry::bench {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

Spread spread(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return {k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]), v.front(), v.back()};
}

Spread rate(std::vector<double> seconds, double work) {
  const Spread s = spread(std::move(seconds));
  if (s.median <= 0) return {};
  return {work / s.median, work / s.max, work / s.min};
}

void alternate_sides(int rounds, const std::function<void()>& ferry, const std::function<void()>& peer) {
  for (int r = 0; r < rounds; ++r) {
    for (int side = 0; side < (peer ? 2 : 1); ++side) {
      if ((r + side) % 2 == 0 || !peer) ferry();
      else peer();
    }
  }
}

void print_table(const Report& r) {
  std::vector<size_t> width(r.columns.size());
  for (size_t c = 0; c < r.columns.size(); ++c) {
    width[c] = r.columns[c].size();
    for (const auto& row : r.table) width[c] = std::max(width[c], row.at(c).size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      std::cout << (c ? "  " : "") << std::string(width[c] - cells[c].size(), ' ') << cells[c];
    }
    std::cout << "\n";
  };
  line(r.columns);
  for (const auto& row : r.table) line(row);
  const Headline& h = r.headline;
  const double ratio = h.reference_value > 0 ? h.value / h.reference_value : 0;
  std::cout << "headline: " << h.metric << " " << fixed(h.value, 2) << " vs " << h.reference << " "
            << fixed(h.reference_value, 2) << ": ratio " << fixed(ratio, 3) << " (goal " << fixed(h.goal, 2)
            << (ratio >= h.goal ? ", met" : ", not met") << ")\n";
  for (const auto& [key, value] : h.extra.items()) std::cout << "  " << key << ": " << value.dump() << "\n";
}

void write_json(const Report& r, const std::string& path) {
  const Headline& h = r.headline;
  nlohmann::json j = {
      {"bench", r.bench},
      {"headline",
       {{"metric", h.metric},
        {"value", h.value},
        {"reference", h.reference},
        {"reference_value", h.reference_value},
        {"ratio", h.reference_value > 0 ? h.value / h.reference_value : 0.0},
        {"goal", h.goal}}},
      {"machine", {{"cpus", std::thread::hardware_concurrency()}, {"threads", r.threads}}},
      {"rows", r.rows}};
  j["headline"].update(h.extra);
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error("--json: cannot write '" + path + "'");
}

}  // namespace ferry::bench
