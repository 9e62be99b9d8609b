// What every fuzz target shares: a scratch folder of its own, inputs that stand for several
// files, and the contract each target checks.
//
// The contract (docs/guide/testing.md, "Fuzzing the parsers"): every input gives a result or a std::runtime_error
// (ferry's error types derive from it) whose message names the file (or folder) at fault.
// Anything else is a failure the fuzzer reports: a crash or sanitizer report, a hang
// (-timeout), an allocation above -malloc_limit_mb, another exception type escaping, or a
// message that names no file (fuzz::check_names() aborts with the message).
//
// Several files from one input: the parts of the input between separator lines
// "\n--8<--\n" are the files of a target's fixed list of names, in order; an empty part
// (or a missing one) leaves that file out, so the fuzzer also tries folders that lack it.
// tests/fuzz/make_corpus.py writes the seeds in this form.
// Threads: libFuzzer runs one input at a time, on one thread.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::fuzz {

inline constexpr std::string_view kPartSeparator = "\n--8<--\n";

// The process's scratch folder under $TMPDIR (or /tmp), emptied before each input and
// removed at exit.
class Scratch {
 public:
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ferry-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    root_ = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  // Empties the folder (files and subfolders of the previous input) and returns it.
  const std::string& fresh() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root_, ec))
      std::filesystem::remove_all(e.path(), ec);
    return root_;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

inline Scratch& scratch() {
  static Scratch s;
  return s;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// The input cut at the separators: at most `n` parts (the last keeps any further
// separators); fewer when the input has fewer.
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t n) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    const size_t at = rest.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(rest);
  return parts;
}

// Writes part i to dir/names[i]; empty and missing parts leave the file out.
inline void write_parts(const std::string& dir, const std::vector<std::string>& names,
                        const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = split_parts(data, size, names.size());
  for (size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].empty()) write_file(dir + "/" + names[i], parts[i]);
}

[[noreturn]] inline void fail(const std::string& why) {
  std::fprintf(stderr, "\nfuzz contract broken: %s\n", why.c_str());
  std::fflush(stderr);
  std::abort();
}

// A refused input must say where: the message names `where` (the file, or the folder the
// files are in), or `also` where a target allows another name (fuzz_config: the
// model.init_from folder's config.json).
inline void check_names(const std::exception& e, const std::string& where,
                        std::string_view also = {}) {
  const std::string what = e.what();
  if (what.find(where) != std::string::npos ||
      (!also.empty() && what.find(also) != std::string::npos))
    return;
  fail("the error does not name " + where + ": " + what);
}

// Runs `body`; a std::runtime_error naming `where` (or `also`) is a refusal (a pass), any
// other exception breaks the contract. With FERRY_FUZZ_VERBOSE set, says which (accepted,
// or the message): for checking what a seed reaches, e.g.
// `FERRY_FUZZ_VERBOSE=1 build-fuzz/tests/fuzz/fuzz_hf_folder tests/fuzz/corpus/fuzz_hf_folder/*`.
template <class Body>
void expect_result_or_named_error(const std::string& where, Body&& body,
                                  std::string_view also = {}) {
  static const bool verbose = std::getenv("FERRY_FUZZ_VERBOSE") != nullptr;
  try {
    body();
    if (verbose) std::fprintf(stderr, "accepted\n");
  } catch (const std::runtime_error& e) {
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
    check_names(e, where, also);
  } catch (const std::exception& e) {
    fail(std::string("an exception that is not a std::runtime_error escaped: ") + e.what());
  }
}

}  // namespace ferry::fuzz
