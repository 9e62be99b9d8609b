// The files behind a Storage: one per folder, preallocated, striped in stripe-sized units
// round-robin (logical stripe s lives in file s mod n at (s div n) x stripe).
// Not thread-safe to construct; for_each_segment() is const and thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ferry::offload {

class StripedFiles {
 public:
  // Opens (creating) NAME.swp in each folder with O_DIRECT when `direct`; `direct` is set to
  // false when the filesystem refuses it (EINVAL), and `why` says so. Throws StorageError
  // for a missing or unwritable folder or too little space, having removed the files it made.
  StripedFiles(const std::vector<std::string>& folders, const std::string& name, uint64_t capacity,
               uint64_t stripe, bool& direct, std::string* why);
  // Closes and removes the files: they are scratch for one run (a normal end, or an error
  // that unwinds the trainer, leaves none). While open they are registered in
  // base/scratch_files.h, so that MPI_Abort (here or on a peer rank: comm/peers.h) and a
  // second stop signal remove them too. Only a process killed outright (SIGKILL, the OOM
  // killer, a node lost) leaves them; the next run with the same folder and name reuses
  // them and removes them at its end.
  ~StripedFiles();
  StripedFiles(const StripedFiles&) = delete;
  StripedFiles& operator=(const StripedFiles&) = delete;

  uint64_t capacity() const { return capacity_; }
  size_t count() const { return fds_.size(); }
  int fd(size_t i) const { return fds_[i]; }
  const std::string& path(size_t i) const { return paths_[i]; }
  // Calls fn(file, file_offset, buffer_offset, length) for the pieces of [offset, offset+len).
  void for_each_segment(uint64_t offset, size_t len,
                        const std::function<void(size_t, uint64_t, size_t, size_t)>& fn) const;
  void sync() const;
  // "ENGINE O_DIRECT on PATH (+N striped)": how a Storage over these files names itself.
  std::string describe(const std::string& engine, bool direct) const;

 private:
  void open_all(const std::vector<std::string>& folders, const std::string& name, uint64_t per_file, bool& direct,
                std::string* why);
  void remove_files() noexcept;

  std::vector<int> fds_;
  std::vector<std::string> paths_;
  uint64_t capacity_ = 0, stripe_ = 0;
};

}  // namespace ferry::offload
