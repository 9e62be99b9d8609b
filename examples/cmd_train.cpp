// ferry train: trains the model a configuration describes.
//   ferry train --config FILE [--deepspeed DS_CONFIG | --fsdp FSDP_CONFIG] [--set key.path=value ...]
//   ferry train --help-config
//   mpiexec -n N ferry train --config FILE ...      (data parallel, ZeRO stage from the config)
//   ferry train --config FILE --resume auto|DIR    (= --set checkpoint.resume=...)
//   ferry train --config FILE --verbose            (the resolved configuration printed in full)
// Output: a short header (the files the configuration came from and where its full listing
// is, the model, where each state lives, the data, the batch, the optimizer), then a line per
// logged step. The model, data and tokenizer are loaded before the header is printed, so a
// refused model folder or data file is the first thing a user reads. The full resolved
// configuration goes to the run folder (runtime/train/run_config.h) and, with --verbose,
// to stdout.
// ferry-train is the same verb as a program of its own (ferry_train.cpp).
// Exit status: 0 done; 1 the run failed (out of device memory, bad data, non-finite loss);
// 2 the configuration or the command line is wrong. With several ranks a failure on one
// rank is reported with its rank and ends the whole job (MPI_Abort); a refused checkpoint
// ends every rank with status 1, the rank that found the problem saying what it is.
// With checkpoint.dir set, SIGTERM/SIGINT end the run after the current step with a
// checkpoint and status 0; a second signal exits at once.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/allocator.h"
#include "base/log.h"
#include "base/rank_output.h"
#include "base/stop_signal.h"
#include "base/version.h"
#include "comm/mpi_communicator.h"
#include "examples/commands.h"
#include "nn/device.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/config/config.h"
#include "runtime/train/run_config.h"
#include "runtime/train/trainer.h"

namespace ferry::cli {

namespace {

struct TrainArgs {
  RunOptions run;
  std::vector<std::string> resume;  // --resume values
  bool help_config = false;
  bool verbose = false;  // --verbose: the resolved configuration in full on stdout
  CLI::App* cmd = nullptr;
};

// --set and --resume overrides in command-line order: a later one wins over an earlier one
// for the same key, as load_config applies them in turn.
std::vector<std::string> ordered_overrides(const TrainArgs& a) {
  std::vector<std::string> out;
  size_t set = 0, resume = 0;
  for (const CLI::Option* o : a.cmd->parse_order()) {
    if (o->get_name() == "--set" && set < a.run.sets.size()) out.push_back(a.run.sets[set++]);
    if (o->get_name() == "--resume" && resume < a.resume.size()) {
      out.push_back("checkpoint.resume=" + a.resume[resume++]);
    }
  }
  return out;
}

int train(const TrainArgs& a) {
  if (a.help_config) {
    std::cout << runtime::describe_knobs();
    return 0;
  }
  if (a.run.config.empty()) throw UsageError("--config FILE is required");
  const std::string& config_path = a.run.config;
  const std::string& deepspeed_path = a.run.deepspeed;
  const std::string& fsdp_path = a.run.fsdp;
  const std::vector<std::string> overrides = ordered_overrides(a);
  // MPI first: the configuration's batch arithmetic depends on the world size.
  std::unique_ptr<comm::MpiCommunicator> comm;
  try {
    comm = comm::MpiCommunicator::world(/*timeout_s=*/0);
  } catch (const std::exception& e) {
    std::cerr << "ferry train: cannot start MPI: " << e.what() << "\n";
    return 1;
  }
  const int rank = comm->rank();
  // A ConfigError from the files is every rank's (each reads the same ones): parse_and_run
  // reports it once and exits 2. The nvme folders are each node's own, so an error there
  // may be some ranks' only, as may anything unexpected: with several ranks that one ends
  // the job through MPI, naming the rank, rather than leave the others waiting.
  runtime::Config config = runtime::load_config(config_path, overrides, comm->size(), deepspeed_path, fsdp_path);
  try {
    runtime::create_nvme_folders(config);  // as DeepSpeed does; an error names the file and key
  } catch (const std::exception& e) {
    if (comm->size() == 1) throw;
    const bool config_error = dynamic_cast<const runtime::ConfigError*>(&e) != nullptr;
    comm::MpiCommunicator::abort_job("ferry train: rank " + std::to_string(rank) + ": " +
                                         (config_error ? "config error: " : "") + e.what(),
                                     config_error ? 2 : 1);
  }
  comm->set_timeout(config.comm_timeout_s);
  comm->set_progress(config.comm_progress == "blocking"  ? comm::MpiCommunicator::Progress::blocking
                     : config.comm_progress == "polling" ? comm::MpiCommunicator::Progress::polling
                                                         : comm::MpiCommunicator::Progress::automatic);
  if (!config.log.rank_logs.empty()) {
    try {
      redirect_rank_output(config.log.rank_logs, rank, comm->size());
    } catch (const std::exception& e) {
      // The other ranks would wait for this one in their first collective.
      comm::MpiCommunicator::abort_job("ferry train: rank " + std::to_string(rank) + ": " + e.what(), 1);
    }
  }
  std::ostream discard(nullptr);  // no buffer: writes are dropped
  // Rank 0 logs; the others warn and fail only, or write their own view of the run to their
  // file (log.rank_logs).
  std::ostream& out = rank == 0 || !config.log.rank_logs.empty() ? std::cout : discard;
  // mpiexec names a rank that dies by its pid: this line maps pids to ranks.
  out << "ferry " << kVersion << " | allocator " << allocator_name() << " | " << comm->size()
      << " rank(s) over MPI, " << (comm->blocking() ? "blocking" : "polling") << " collectives | pids:";
  for (size_t r = 0; r < comm->ranks().size(); ++r) out << " r" << r << "=" << comm->ranks()[r].pid;
  out << " | " << comm::describe_nodes(comm->ranks()) << "\n";
  out.flush();
  if (rank == 0) {
    for (const std::string& w : config.deepspeed.warnings) log::warn(log::Subsys::config, w);
    for (const std::string& w : config.fsdp.warnings) log::warn(log::Subsys::config, w);
  }
  if (!config.checkpoint.dir.empty()) install_stop_handlers();
  const runtime::ConfigSources sources{config_path, overrides};
  const std::string record_path = runtime::run_config_path(config);
  std::string failure;
  try {
    // First: the model folder, the data and the tokenizer are read (and refused) here.
    runtime::Trainer trainer(config, *comm, out);
    if (a.verbose) out << runtime::describe_config_full(config, sources);
    out << runtime::describe_config_header(config, sources, record_path);
    trainer.run([&](int64_t resumed_from) {
      if (rank != 0 || record_path.empty()) return;
      try {
        runtime::write_run_config(record_path, runtime::run_config_record(config, sources, resumed_from));
      } catch (const std::exception& e) {
        // The run itself does not need the file: say so and train.
        log::warn(log::Subsys::config, std::string(e.what()) + "; --verbose prints the configuration");
      }
    });
  } catch (const runtime::CheckpointError& e) {
    // Every rank got here together (loading is collective): no abort needed.
    if (!e.reported_elsewhere) std::cerr << "ferry train: rank " << rank << ": checkpoint refused: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty()) {
    comm->set_exit_status(0);
    return 0;
  }
  const std::string message = "ferry train: rank " + std::to_string(rank) + ": " + failure;
  if (comm->size() > 1) comm::MpiCommunicator::abort_job(message, 1);
  std::cerr << message << "\n";
  return 1;
}

}  // namespace

Run train_command(CLI::App& cmd) {
  auto a = std::make_shared<TrainArgs>();
  a->cmd = &cmd;
  cmd.description("train the model a configuration describes (mpiexec -n N for N data-parallel ranks)");
  add_run_options(cmd, a->run, /*with_ranks=*/false);
  cmd.add_option("--resume", a->resume, "auto | none | CHECKPOINT_DIR (= --set checkpoint.resume=...)")
      ->allow_extra_args(false);
  cmd.add_flag("--help-config", a->help_config, "print every configuration key, its default and meaning");
  cmd.add_flag("--verbose", a->verbose,
               "print the resolved configuration in full (every key, and the --deepspeed/--fsdp lists); "
               "without it the header says where the run folder keeps it");
  return [a] { return train(*a); };
}

}  // namespace ferry::cli
