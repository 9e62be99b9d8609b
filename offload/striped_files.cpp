#include "offload/striped_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/io_faults.h"
#include "base/scratch_files.h"
#include "offload/storage.h"

namespace ferry::offload {

StorageError::StorageError(const std::string& p, uint64_t off, size_t len, int e, const std::string& what)
    : std::runtime_error(what + " '" + p + "' at offset " + std::to_string(off) + ", " + std::to_string(len) +
                         " bytes: " + std::strerror(e) + " (errno " + std::to_string(e) + ")"),
      path(p),
      offset(off),
      length(len),
      err(e) {}

StripedFiles::StripedFiles(const std::vector<std::string>& folders, const std::string& name, uint64_t capacity,
                           uint64_t stripe, bool& direct, std::string* why)
    : stripe_(stripe) {
  if (folders.empty()) throw StorageError("(no nvme_path)", 0, 0, EINVAL, "storage needs at least one folder:");
  const uint64_t n = folders.size();
  const uint64_t stripes = (capacity + stripe - 1) / stripe;
  const uint64_t per_file = (stripes + n - 1) / n * stripe;
  capacity_ = per_file * n;
  try {
    open_all(folders, name, per_file, direct, why);
  } catch (...) {
    remove_files();  // a later folder failed: the files already made go too
    throw;
  }
}

void StripedFiles::open_all(const std::vector<std::string>& folders, const std::string& name, uint64_t per_file,
                            bool& direct, std::string* why) {
  for (const std::string& folder : folders) {
    struct stat st{};
    if (stat(folder.c_str(), &st) != 0) throw StorageError(folder, 0, 0, errno, "nvme_path: cannot use folder");
    if (!S_ISDIR(st.st_mode)) throw StorageError(folder, 0, 0, ENOTDIR, "nvme_path: not a folder:");
    if (access(folder.c_str(), W_OK) != 0) throw StorageError(folder, 0, 0, errno, "nvme_path: cannot write in folder");
    struct statvfs vfs{};
    const std::string path = folder + "/" + name + ".swp";
    if (statvfs(folder.c_str(), &vfs) == 0) {
      struct stat existing{};
      const uint64_t have = stat(path.c_str(), &existing) == 0 ? static_cast<uint64_t>(existing.st_blocks) * 512 : 0;
      const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize + have;
      if (free_bytes < per_file) {
        throw StorageError(path, 0, per_file, ENOSPC,
                           "nvme_path: too small: needs " + std::to_string(per_file) + " bytes, " +
                               std::to_string(free_bytes) + " free, for");
      }
    }
    int fd = -1;
    if (direct) {
      fd = open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
      if (fd < 0 && errno == EINVAL) {
        direct = false;
        if (why) *why = "O_DIRECT refused on '" + folder + "' (EINVAL): buffered I/O through the page cache";
      }
    }
    if (fd < 0) fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw StorageError(path, 0, 0, errno, "cannot open");
    fds_.push_back(fd);
    paths_.push_back(path);
    register_scratch_file(path);  // an abort (MPI_Abort, a second stop signal) removes it too
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(per_file));
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
      throw StorageError(path, 0, per_file, rc, "cannot preallocate");
    }
  }
  // O_DIRECT is per file: keep the set uniform, so alignment is the same everywhere.
  if (!direct) {
    for (int fd : fds_) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT);
  }
}

StripedFiles::~StripedFiles() { remove_files(); }

// The files hold only this run's live state (checkpoints are written elsewhere): nothing in
// them is worth keeping once the storage is gone, and a preallocated file per rank is often
// gigabytes. An open file's blocks stay readable to any process that still has it open.
void StripedFiles::remove_files() noexcept {
  for (size_t i = 0; i < fds_.size(); ++i) {
    close(fds_[i]);
    unlink(paths_[i].c_str());  // best effort: ENOENT (removed by hand, or by an abort) is no error at the end
    unregister_scratch_file(paths_[i]);
  }
  fds_.clear();
  paths_.clear();
}

void StripedFiles::for_each_segment(uint64_t offset, size_t len,
                                    const std::function<void(size_t, uint64_t, size_t, size_t)>& fn) const {
  const uint64_t n = fds_.size();
  size_t done = 0;
  while (done < len) {
    const uint64_t o = offset + done;
    const uint64_t s = o / stripe_, within = o % stripe_;
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(stripe_ - within, len - done));
    fn(static_cast<size_t>(s % n), (s / n) * stripe_ + within, done, piece);
    done += piece;
  }
}

std::string StripedFiles::describe(const std::string& engine, bool direct) const {
  std::string s = engine + (direct ? " O_DIRECT" : " buffered") + " on " + paths_.at(0);
  if (paths_.size() > 1) s += " (+" + std::to_string(paths_.size() - 1) + " striped)";
  return s;
}

void StripedFiles::sync() const {
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (io_fdatasync(fds_[i], paths_[i]) != 0) throw StorageError(paths_[i], 0, 0, errno, "fdatasync");
  }
}

}  // namespace ferry::offload
