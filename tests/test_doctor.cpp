// ferry doctor's checks: free space arithmetic, the O_DIRECT round trip, a whole run of
// the checks for a configuration whose nvme folder is missing (ok: ferry train creates it)
// and whose state outgrows this machine (each named with its fix), the missing folders
// that cannot be created, and `--gpu`'s checks where there is no driver
// and on the figures a GPU would report.
#define BOOST_TEST_MODULE doctor
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/tools/doctor.h"
#include "runtime/tools/doctor_gpu.h"
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
        {"offload_param", {{"device", "nvme"}, {"nvme_path", (dir.path / "absent" / "deeper").string()}}}}}};
  const Config c = config_from_json(doc, "t.json", "/", {}, 1);
  DoctorOptions o;
  o.config = &c;  // no program path: the MPI probe is skipped with a warning
  const std::vector<DoctorCheck> checks = run_doctor(o);
  const DoctorCheck* mpi = find(checks, "mpi", "not checked");
  BOOST_REQUIRE(mpi);
  BOOST_TEST(mpi->status == DoctorCheck::warn);
  // A missing folder ferry train will create (two levels): ok, checked on its parent, and
  // the doctor made nothing.
  const std::string absent_path = (dir.path / "absent" / "deeper").string();
  const DoctorCheck* absent = find(checks, "nvme", absent_path + ": does not exist yet");
  BOOST_REQUIRE(absent);
  BOOST_TEST(absent->status == DoctorCheck::ok);
  BOOST_TEST(absent->detail == absent_path + ": does not exist yet: will be created by ferry train (under " +
                                   dir.path.string() + ", writable)");
  BOOST_TEST(find(checks, "nvme", absent_path + " (on " + dir.path.string() + "): "));
  BOOST_TEST(!std::filesystem::exists(dir.path / "absent"));
  // 25 billion parameters: the optimizer state (24 bytes each) cannot fit this disk, nor
  // the gradient shards this host's memory.
  const DoctorCheck* space = find(checks, "nvme space", "needs");
  BOOST_REQUIRE(space);
  BOOST_TEST(space->status == DoctorCheck::fail);
  const DoctorCheck* memory = find(checks, "memory", "need");
  BOOST_REQUIRE(memory);
  BOOST_TEST(memory->status == DoctorCheck::fail);
  const std::string text = format_checks(checks);
  BOOST_TEST(text.find("[ ok ] nvme: " + absent_path + ": does not exist yet") != std::string::npos, text);
  BOOST_TEST(text.find("problem(s) would stop a run") != std::string::npos);
}

// What stops `ferry train` from creating a missing nvme_path folder, and what does not.
BOOST_AUTO_TEST_CASE(folders_to_create) {
  namespace fs = std::filesystem;
  ferry::test::TempDir dir("doctor_mkdir");
  const std::string root = dir.path.string();
  { std::ofstream(dir.path / "file") << "x"; }
  fs::create_symlink(dir.path / "nowhere", dir.path / "dangling");
  std::string at = "unchanged";
  BOOST_TEST(folder_to_create(root + "/a/b/c", at) == "");
  BOOST_TEST(at == root);
  BOOST_TEST(folder_to_create(root + "/a/", at) == "");  // a trailing slash
  BOOST_TEST(at == root);
  BOOST_TEST(folder_to_create(root + "/file", at) == "exists and is not a folder");
  BOOST_TEST(at == "");
  BOOST_TEST(folder_to_create(root + "/file/a/b", at) == root + "/file is not a folder");
  BOOST_TEST(folder_to_create(root + "/dangling/a", at) == root + "/dangling is a link to a missing target");
  BOOST_TEST(folder_to_create("/dev/null/ferry", at) == "/dev/null is not a folder");
  // A folder without write permission (root writes anywhere: checked only as a user).
  fs::create_directory(dir.path / "locked");
  fs::permissions(dir.path / "locked", fs::perms::owner_read | fs::perms::owner_exec);
  if (::geteuid() != 0) {
    BOOST_TEST(folder_to_create(root + "/locked/x", at) == "cannot create folders in " + root + "/locked: Permission denied");
  }
  fs::permissions(dir.path / "locked", fs::perms::owner_all);
  BOOST_TEST(!fs::exists(dir.path / "a"));

  // Through run_doctor: a failure naming the reason; nothing created.
  const nlohmann::json doc = {
      {"model", {{"n_layer", 2}, {"n_embd", 32}, {"n_head", 2}}},
      {"data", {{"path", "corpus.txt"}}},
      {"zero_optimization",
       {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", root + "/file/nvme"}}}}}};
  const Config c = config_from_json(doc, "t.json", "/", {}, 1);
  DoctorOptions o;
  o.config = &c;
  const std::vector<DoctorCheck> checks = run_doctor(o);
  const DoctorCheck* blocked = find(checks, "nvme", "cannot be created");
  BOOST_REQUIRE(blocked);
  BOOST_TEST(blocked->status == DoctorCheck::fail);
  BOOST_TEST(blocked->detail == root + "/file/nvme: cannot be created: " + root + "/file is not a folder");
  BOOST_TEST(!find(checks, "nvme space", ""));  // no space figure for a folder that cannot be
  BOOST_TEST(format_checks(checks).find("problem(s) would stop a run") != std::string::npos);
}

// --gpu on a machine without a driver (a library name no machine has, so the test means
// the same on a GPU machine): one failed check that says there is no GPU and why, and
// found_no_gpu, which makes `ferry doctor --gpu` exit 3.
BOOST_AUTO_TEST_CASE(gpu_checks_without_a_driver) {
  GpuDoctorOptions o;
  o.libcuda = "libcuda-ferry-absent.so.1";
  const std::vector<DoctorCheck> checks = run_gpu_doctor(o);
  BOOST_REQUIRE_EQUAL(checks.size(), 1u);
  BOOST_TEST(checks[0].name == "gpu");
  BOOST_TEST(checks[0].status == DoctorCheck::fail);
  BOOST_TEST(checks[0].detail == "no GPU: no CUDA driver (libcuda-ferry-absent.so.1 cannot be loaded)");
  BOOST_TEST(found_no_gpu(checks));
  BOOST_TEST(format_checks(checks).find("[FAIL] gpu: no GPU: no CUDA driver") == 0u, format_checks(checks));
  BOOST_TEST(kDoctorNoGpuExit == 3);
  // A failed check of another kind is not "no GPU".
  std::vector<DoctorCheck> other = checks;
  other[0].detail = "driver 12.4, 8 GPU(s) visible";
  BOOST_TEST(!found_no_gpu(other));
  other[0].name = "nccl";
  other[0].detail = "no GPU: named by another check";
  BOOST_TEST(!found_no_gpu(other));
}

// What the GPU lines compute from a GPU's figures: H100's and A100's opt-in shared memory
// against attention's largest kernel (review F5), NVIDIA_TF32_OVERRIDE, and the
// verdict on MPI_Init from the probe's line.
BOOST_AUTO_TEST_CASE(gpu_check_pieces) {
  BOOST_TEST(attention_max_head(232448, 4) == 256);  // H100: 227 KiB
  BOOST_TEST(attention_max_head(232448, 8) == 256);  // f64 accumulation
  BOOST_TEST(attention_max_head(166912, 4) == 256);  // A100: 163 KiB
  BOOST_TEST(attention_max_head(49152, 4) == 116);   // 48 KiB without the opt-in
  BOOST_TEST(attention_max_head(512, 4) == 0);
  BOOST_TEST(tensor_core_attention_line(9).find("on tensor cores") != std::string::npos);   // H100
  BOOST_TEST(tensor_core_attention_line(8).find("on tensor cores") != std::string::npos);   // A100
  BOOST_TEST(tensor_core_attention_line(7).find("SIMT kernels only") != std::string::npos); // V100

  for (const char* yes : {"libcuda.so.1", "libcudart.so.13", "libcublasLt.so.13", "libnccl.so.2", "libnvidia-ml.so.1",
                          "libuct_cuda.so.0", "libnvrtc.so.13"})
    BOOST_TEST(is_cuda_library(yes), yes);
  for (const char* no : {"libicudata.so.74.2", "libcurl.so.4", "libmpich.so.12", "cuda.so", "libucs.so.0"})
    BOOST_TEST(!is_cuda_library(no), no);

  BOOST_TEST(check_tf32(nullptr).status == DoctorCheck::ok);
  BOOST_TEST(check_tf32("0").status == DoctorCheck::ok);
  const DoctorCheck tf32 = check_tf32("1");
  BOOST_TEST(tf32.status == DoctorCheck::warn);
  BOOST_TEST(tf32.detail.find("NVIDIA_TF32_OVERRIDE=1") == 0u, tf32.detail);
  BOOST_TEST(!tf32.fix.empty());

  const DoctorCheck clean = mpi_cuda_verdict(0, "gpu mpi probe: contexts before 0,0 after 0,0; new libraries none\n", nullptr);
  BOOST_TEST(clean.status == DoctorCheck::ok);
  BOOST_TEST(clean.detail == "MPI_Init created no CUDA context and loaded no CUDA library (MPIR_CVAR_ENABLE_GPU unset)");
  const DoctorCheck loads =
      mpi_cuda_verdict(0, "gpu mpi probe: contexts before 0,0 after 0,0; new libraries libcudart.so.12\n", "1");
  BOOST_TEST(loads.status == DoctorCheck::ok);
  BOOST_TEST(loads.detail.find("loaded libcudart.so.12") != std::string::npos, loads.detail);
  BOOST_TEST(loads.detail.find("(MPIR_CVAR_ENABLE_GPU=1)") != std::string::npos, loads.detail);
  const DoctorCheck ctx =
      mpi_cuda_verdict(0, "gpu mpi probe: contexts before 0,0,0 after 1,0,1; new libraries libcudart.so.12\n", nullptr);
  BOOST_TEST(ctx.status == DoctorCheck::warn);
  BOOST_TEST(ctx.detail.find("MPI_Init created a CUDA context on GPU 0,2 ") == 0u, ctx.detail);
  BOOST_TEST(ctx.fix.find("MPIR_CVAR_ENABLE_GPU=0") != std::string::npos);
  const DoctorCheck broken = mpi_cuda_verdict(124, "", nullptr);
  BOOST_TEST(broken.status == DoctorCheck::warn);
  BOOST_TEST(broken.detail == "the 1-rank probe did not answer (exit 124)");
}
