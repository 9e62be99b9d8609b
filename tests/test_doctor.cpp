// ferry doctor's checks: free space arithmetic, the O_DIRECT round trip, and a whole run of
// the checks for a configuration whose nvme folder is missing and whose state outgrows
// this machine (each named with its fix).
#define BOOST_TEST_MODULE doctor
#include <boost/test/unit_test.hpp>

#include "runtime/tools/doctor.h"
#include "test_util.h"

using namespace ferry::runtime;

namespace {

const DoctorCheck* find(const std::vector<DoctorCheck>& checks, const std::string& name, const std::string& part) {
  for (const DoctorCheck& c : checks)
    if (c.name == name && c.detail.find(part) != std::string::npos) return &c;
  return nullptr;
}

}  // namespace

BOOST_AUTO_TEST_CASE(space) {
  BOOST_TEST(check_space("/d", 100, 100).status == DoctorCheck::ok);
  const DoctorCheck c = check_space("/d", 2048, 1024);
  BOOST_TEST(c.status == DoctorCheck::fail);
  BOOST_TEST(c.detail == "/d: 1.00 KiB (1024 bytes) free but the offloaded state needs 2.00 KiB (2048 bytes)");
  BOOST_TEST(!c.fix.empty());
}

BOOST_AUTO_TEST_CASE(o_direct) {
  ferry::test::TempDir dir("doctor_direct");
  const std::string here = o_direct_round_trip(dir.path.string());
  // The build machine's temp folder may be tmpfs, which refuses O_DIRECT with EINVAL.
  BOOST_TEST((here.empty() || here.rfind("open(O_DIRECT): Invalid argument", 0) == 0), here);
  BOOST_TEST(o_direct_round_trip((dir.path / "missing").string()) == "open(O_DIRECT): No such file or directory");
}

BOOST_AUTO_TEST_CASE(a_configuration_that_would_stop) {
  ferry::test::TempDir dir("doctor_cfg");
  const nlohmann::json doc = {
      {"model", {{"n_layer", 2000}, {"n_embd", 1024}, {"n_head", 8}}},
      {"data", {{"path", "corpus.txt"}}},
      {"device", {{"memory", "1TB"}}},
      {"zero_optimization",
       {{"stage", 3},
        {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir.path.string()}}},
        {"offload_param", {{"device", "nvme"}, {"nvme_path", (dir.path / "absent").string()}}}}}};
  const Config c = config_from_json(doc, "t.json", "/", {}, 1);
  DoctorOptions o;
  o.config = &c;  // no program path: the MPI probe is skipped with a warning
  const std::vector<DoctorCheck> checks = run_doctor(o);
  const DoctorCheck* mpi = find(checks, "mpi", "not checked");
  BOOST_REQUIRE(mpi);
  BOOST_TEST(mpi->status == DoctorCheck::warn);
  const DoctorCheck* absent = find(checks, "nvme", "absent: no such folder");
  BOOST_REQUIRE(absent);
  BOOST_TEST(absent->status == DoctorCheck::fail);
  BOOST_TEST(absent->fix.find("mkdir -p") == 0u);
  // 25 billion parameters: the optimizer state (24 bytes each) cannot fit this disk, nor
  // the gradient shards this host's memory.
  const DoctorCheck* space = find(checks, "nvme space", "needs");
  BOOST_REQUIRE(space);
  BOOST_TEST(space->status == DoctorCheck::fail);
  const DoctorCheck* memory = find(checks, "memory", "need");
  BOOST_REQUIRE(memory);
  BOOST_TEST(memory->status == DoctorCheck::fail);
  const std::string text = format_checks(checks);
  BOOST_TEST(text.find("[FAIL] nvme: " + (dir.path / "absent").string() + ": no such folder\n       fix: mkdir -p") !=
             std::string::npos, text);
  BOOST_TEST(text.find("problem(s) would stop a run") != std::string::npos);
}
