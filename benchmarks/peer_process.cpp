#include "benchmarks/peer_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

namespace ferry::bench {

PeerProcess::PeerProcess(std::string what, std::string python, const std::string& script,
                         const std::vector<std::string>& env,
                         std::string flag)
    : what_(std::move(what)), python_(std::move(python)), script_(script), flag_(std::move(flag)) {
  char err_path[] = "/tmp/ferry_peer_XXXXXX";
  const int err = mkstemp(err_path);
  if (err < 0) throw std::runtime_error(flag_ + ": cannot create a temporary file in /tmp");
  err_path_ = err_path;
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int fd : {in[0], in[1], out[0], out[1], err}) {
      if (fd >= 0) close(fd);
    }
    std::remove(err_path);
    throw std::runtime_error(flag_ + ": pipe: " + std::strerror(e));
  }
  std::vector<std::string> args = {python_, script_};
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err, 2);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err);
  if (pid_ < 0) {
    const int e = errno;
    close(in[1]);
    close(out[0]);
    std::remove(err_path);
    throw std::runtime_error(flag_ + ": fork: " + std::strerror(e));
  }
  to_ = fdopen(in[1], "w");
  from_ = fdopen(out[0], "r");
  signal(SIGPIPE, SIG_IGN);  // a peer that died is reported from its status, not by a signal here
  try {
    hello_ = read_answer();
    if (!hello_.is_object() || !hello_.value("ready", false)) throw failure("did not say it was ready");
  } catch (...) {
    close_all();  // no destructor runs for a constructor that throws
    throw;
  }
}

PeerProcess::~PeerProcess() { close_all(); }

void PeerProcess::close_all() {
  if (to_) std::fclose(to_);
  if (from_) std::fclose(from_);
  to_ = from_ = nullptr;
  if (pid_ > 0) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  if (!err_path_.empty()) std::remove(err_path_.c_str());
  err_path_.clear();
}

nlohmann::json PeerProcess::request(const nlohmann::json& req) {
  const std::string line = req.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), to_) != line.size() || std::fflush(to_) != 0) {
    throw failure("stopped taking requests");
  }
  return read_answer();
}

nlohmann::json PeerProcess::read_answer() {
  std::string line;
  for (int c; (c = std::fgetc(from_)) != EOF && c != '\n';) line += static_cast<char>(c);
  if (line.empty()) {
    // The script ended: its status and the end of its stderr say why.
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    throw failure(code == 127 ? "did not start: no such Python (exit 127)"
                              : "ended (exit " + std::to_string(code) +
                                    "; the script's first lines say what it needs)");
  }
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw failure("answered something that is not JSON: " + line.substr(0, 200));
  if (j.is_object() && j.contains("error")) throw failure("failed: " + j["error"].dump());
  return j;
}

std::string quoted_tail(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::string tail;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) tail.append("\n  ").append(lines[i]);
  return tail;
}

std::runtime_error PeerProcess::failure(const std::string& what) {
  const std::string tail = quoted_tail(err_path_, 4);
  std::string msg = flag_ + " ";
  msg.append(python_).append(": ").append(what_).append(" (").append(script_).append(") ").append(what);
  if (!tail.empty()) msg.append(":").append(tail);
  return std::runtime_error(msg);
}

}  // namespace ferry::bench
