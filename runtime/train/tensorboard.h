// TensorBoard event files, written without TensorFlow or a protobuf library: `tensorboard
// --logdir DIR` (and anything else that reads event files) shows ferry's scalars as curves.
//
// What TensorBoard needs, and so what this writes: a file whose name contains "tfevents"
// (TensorBoard's own naming, events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, which also
// sorts by start time: TensorBoard reads a run's files in name order); a stream of TFRecords
// (uint64 length, masked CRC-32C of the length, the bytes, masked CRC-32C of the bytes, all
// little endian), each an `Event` protobuf; first an Event with file_version "brain.Event:2",
// then one Event per scalar with wall_time, step and a Summary holding one Value{tag,
// simple_value}. simple_value is the legacy scalar encoding, which TensorBoard converts to
// its scalar plugin's on load; it carries a float, so values are rounded to float32.
//
// A resumed run creates a new file in the same folder; TensorBoard merges the files of a
// folder into one run, so the curves continue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace ferry::runtime {

// One thread uses a writer (no locks inside). It owns its open file and closes it when
// destroyed. Errors of the environment (folder or file that cannot be created, a failed
// write or flush) throw std::runtime_error naming the file; the destructor flushes but
// cannot report, so call flush() before it where a lost tail matters.
class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, never overwriting one:
  // `filename_suffix` (may be empty) is appended to the name. The first record's wall time
  // is `start_wall_time_s`, by default the clock now; tests fix it for byte-exact files.
  // The name's seconds always come from the clock, so a resumed run's file sorts last.
  TensorBoardWriter(const std::string& dir, const std::string& filename_suffix,
                    std::optional<double> start_wall_time_s = std::nullopt);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Buffered: reaches the file by flush() or the destructor. `value` is stored as float32.
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time_s);
  // A SessionLog START at `step`: TensorBoard's loader then drops the points of this run's
  // folder logged at `step` or later before this event (a crashed run's steps after the
  // checkpoint that a resumed run logs again). Buffered like add_scalar.
  void session_start(int64_t step, double wall_time_s);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// One scalar as a reader sees it (simple_value Values only; other Values are skipped).
struct TensorBoardScalar {
  std::string tag;
  int64_t step = 0;
  float value = 0;
  double wall_time = 0;
};

// Reads every scalar of an event file in file order, for tests and tools. Checks the
// framing and both CRCs of every record and decodes each Event, skipping fields it does not
// know by their wire type. Any corruption (a truncated record, a bad CRC, a length past the
// end of the file, a malformed protobuf) throws std::runtime_error naming the file and the
// byte offset of the record. Allocates no more than the file's size.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& file);

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), unmasked; TFRecord's checksum.
uint32_t crc32c(const void* data, size_t n);

}  // namespace ferry::runtime
