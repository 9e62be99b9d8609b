// What every `ferry bench` benchmark prints and writes: a table on stdout and, with
// --json PATH, one object {"bench", "headline", "machine", "rows"} as described in
// ARCHITECTURE.md (Benchmarks).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::bench {

struct Headline {
  std::string metric;
  double value = 0;
  std::string reference;
  double reference_value = 0;
  double goal = 0;  // on the ratio value / reference_value
  nlohmann::json extra = nlohmann::json::object();  // more headline figures, merged into it
};

struct Report {
  std::string bench;
  Headline headline;
  int threads = 0;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> table;  // printed
  nlohmann::json rows = nlohmann::json::array();  // written
};

void print_table(const Report& r);
// Throws std::runtime_error naming the path when it cannot be written.
void write_json(const Report& r, const std::string& path);
std::string fixed(double v, int digits);

// Repeated measurements: the median (the mean of the middle two for an even count), min
// and max; all 0 for no samples.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> samples);
// The rate `work` per second over samples of seconds: its median, min (the slowest
// sample) and max.
Spread rate(std::vector<double> seconds, double work);
// A benchmark against a peer measured in the same run: `rounds` rounds of ferry's side and
// the peer's, each round starting with the other one (the first with ferry's), so that
// neither side always runs on a machine the other has just warmed or tired. Without a
// peer (`peer` empty) ferry's side runs once per round.
void alternate_sides(int rounds, const std::function<void()>& ferry, const std::function<void()>& peer);

}  // namespace ferry::bench
