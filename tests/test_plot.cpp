// ferry plot: metrics files read (a resumed run's repeated steps replaced, errors naming the
// file and line), the gnuplot program's data, and a real PNG drawn by gnuplot.
#define BOOST_TEST_MODULE plot
#include <boost/test/unit_test.hpp>

#include <fstream>

#include "runtime/tools/plot.h"
#include "test_util.h"

using namespace ferry::runtime;
namespace fs = std::filesystem;

namespace {

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

std::string error_of(const std::string& path) {
  try {
    read_metrics(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  BOOST_FAIL("no error for " + path);
  return "";
}

uint32_t be32(const unsigned char* p) { return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3]; }

}  // namespace

BOOST_AUTO_TEST_CASE(reads_steps_and_evaluations) {
  ferry::test::TempDir dir("plot_read");
  // Steps 1-3, an evaluation, then a run resumed from step 2 that appends steps 3-4 again.
  const std::string path = write(dir.path / "m.jsonl",
                                 "{\"step\":1,\"loss\":5.5,\"tokens_per_s\":1000,\"tflops\":0.1}\n"
                                 "{\"step\":2,\"loss\":4.0,\"tokens_per_s\":1100,\"tflops\":0.11}\n"
                                 "{\"step\":3,\"loss\":3.9,\"tokens_per_s\":1200,\"tflops\":0.12}\n"
                                 "{\"step\":2,\"val_loss\":4.2}\n"
                                 "\n"
                                 "{\"step\":3,\"loss\":3.5,\"tokens_per_s\":900,\"tflops\":0.09}\n"
                                 "{\"step\":4,\"loss\":3.0,\"tokens_per_s\":950,\"tflops\":0.095}\n");
  const MetricsSeries m = read_metrics(path);
  BOOST_TEST(m.step == (std::vector<double>{1, 2, 3, 4}), boost::test_tools::per_element());
  BOOST_TEST(m.loss == (std::vector<double>{5.5, 4.0, 3.5, 3.0}), boost::test_tools::per_element());
  BOOST_TEST(m.tokens_per_s[2] == 900.0);
  BOOST_TEST(m.eval_step == std::vector<double>{2});
  BOOST_TEST(m.val_loss == std::vector<double>{4.2});
  const std::string script = gnuplot_script(m, "out.png", "run");
  BOOST_TEST(script.find("$steps << EOD\n1 5.5 1000 0.1\n2 4 1100 0.11\n3 3.5 900 0.09\n4 3 950 0.095\nEOD\n") !=
                 std::string::npos,
             script);
  BOOST_TEST(script.find("$evals << EOD\n2 4.2\nEOD\n") != std::string::npos, script);
  BOOST_TEST(script.find("axes x1y2") != std::string::npos);  // TFLOP/s on the right axis
}

BOOST_AUTO_TEST_CASE(bad_files_name_file_and_line) {
  ferry::test::TempDir dir("plot_bad");
  const std::string missing = (dir.path / "none.jsonl").string();
  BOOST_TEST(error_of(missing) == missing + ": cannot open the metrics file");
  const std::string garbled = write(dir.path / "g.jsonl", "{\"step\":1,\"loss\":5,\"tokens_per_s\":1}\n{\"step\":2,\"lo\n");
  BOOST_TEST(error_of(garbled) == garbled + ":2: not a JSON object");
  const std::string no_step = write(dir.path / "s.jsonl", "{\"loss\":5}\n");
  BOOST_TEST(error_of(no_step) == no_step + ":1: no \"step\" number");
  const std::string evals_only = write(dir.path / "e.jsonl", "{\"step\":1,\"val_loss\":5}\n");
  BOOST_TEST(error_of(evals_only).find("no step records") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(gnuplot_draws_a_png) {
  ferry::test::TempDir dir("plot_png");
  std::string lines;
  for (int s = 1; s <= 50; ++s) {
    lines += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(5.0 / s) + ",\"tokens_per_s\":" +
             std::to_string(1000 + s) + "}\n";
  }
  const std::string path = write(dir.path / "m.jsonl", lines + "{\"step\":50,\"val_loss\":0.2}\n");
  const std::string png = (dir.path / "run.png").string();
  const MetricsSeries m = read_metrics(path);
  BOOST_TEST(gnuplot_script(m, png, "t").find("axes x1y2") == std::string::npos);  // no TFLOP/s recorded
  run_gnuplot(gnuplot_script(m, png, "t"), png);
  std::ifstream in(png, std::ios::binary);
  unsigned char head[24] = {};
  BOOST_REQUIRE(in.read(reinterpret_cast<char*>(head), 24));
  BOOST_TEST(std::string(reinterpret_cast<char*>(head) + 1, 3) == "PNG");
  BOOST_TEST(std::string(reinterpret_cast<char*>(head) + 12, 4) == "IHDR");
  BOOST_TEST(be32(head + 16) == 1200u);  // width
  BOOST_TEST(be32(head + 20) == 800u);   // height
  BOOST_TEST(fs::file_size(png) > 10000u);  // curves, axes and labels, not an empty canvas
}
