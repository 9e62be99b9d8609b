// Scratch files to remove if the process ends without unwinding: NVMe swap files
// (offload/striped_files.h) are removed by their owner's destructor, but MPI_Abort (a
// fatal error on another rank, the watchdog) kills a rank in place and a second stop
// signal _exits, so the path that ends the process calls remove_scratch_files() first.
// Only files a run made for itself and nothing keeps belong here: never checkpoints.
//
// The table is fixed and preallocated (kMaxScratchFiles paths of at most kMaxScratchPath
// bytes): registering never allocates, and removal may run in a signal handler.
// Threads: every function may be called from any thread at any time.
#pragma once

#include <cstddef>
#include <string>

namespace ferry {

inline constexpr size_t kMaxScratchFiles = 64;
inline constexpr size_t kMaxScratchPath = 4096;  // PATH_MAX, with its NUL

// Adds `path`. False when the table is full or the path too long: the file is then left
// by an abort, as it was before this table existed (callers need not treat it as an error).
// After end_scratch_files() the file is unlinked at once instead (its open descriptors
// still work), and false is returned.
bool register_scratch_file(const std::string& path);
// Removes one entry equal to `path` (none: nothing happens). Call after unlinking the file
// yourself, so that an abort in between finds it gone rather than left.
void unregister_scratch_file(const std::string& path);
bool is_scratch_file(const std::string& path);
// unlink()s every registered path and empties the table; returns how many it unlinked.
// Async-signal-safe: no allocation, no lock, only atomics and unlink(2).
int remove_scratch_files() noexcept;
// The process is about to end without unwinding (MPI_Abort, _exit): remove_scratch_files(),
// and from now on every file registered is unlinked at once, so that one another thread
// creates meanwhile (a rank still starting when a peer aborts the job) is not left either.
// Async-signal-safe, as remove_scratch_files(). Irreversible.
void end_scratch_files() noexcept;

}  // namespace ferry
