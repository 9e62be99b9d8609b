// A peer benchmark (a Python script using the peer library: torch, DeepSpeed or Hugging Face
// tokenizers, benchmarks/peers/) kept running beside ferry's: started once, it answers one JSON line per request line. Its start
// (importing torch, loading a DeepSpeed op: seconds) is paid once, so that ferry's runs and
// the peer's can alternate case by case and repetition by repetition.
//
// Protocol: the script first prints {"ready": true, "torch": V, "deepspeed": V, ...} on
// stdout, then reads requests from stdin and prints one JSON object per request; anything
// else it prints goes to stderr, kept in a temporary file and quoted (its last lines) when
// the peer fails.
//
// Errors: std::runtime_error naming the Python, the script and the cause (no such Python,
// the script's exit status and the end of its stderr, an answer that is not JSON).
// Not thread safe; one request at a time.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::bench {

// The last `n` non-empty lines of the file at `path`, each as "\n  line" (the tail quoted
// in error messages); "" when it cannot be read.
std::string quoted_tail(const std::string& path, size_t n);

class PeerProcess {
 public:
  // `what` names the peer in errors ("DeepSpeed's aio"), and `flag` the option that gave
  // `python`; `env` holds NAME=VALUE pairs added to this process's environment for the script.
  PeerProcess(std::string what, std::string python, const std::string& script, const std::vector<std::string>& env,
              std::string flag = "--peers");
  ~PeerProcess();  // closes its stdin (the script ends) and waits for it
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  const nlohmann::json& hello() const { return hello_; }  // the ready line
  nlohmann::json request(const nlohmann::json& req);

 private:
  nlohmann::json read_answer();
  void close_all();
  std::runtime_error failure(const std::string& what);

  std::string what_, python_, script_, flag_;
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;    // its stdin
  std::FILE* from_ = nullptr;  // its stdout
  std::string err_path_;
  nlohmann::json hello_;
};

}  // namespace ferry::bench
