#include "runtime/train/metrics.h"

#include <stdexcept>

namespace ferry::runtime {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc), path_(path) {
  if (!out_) throw std::runtime_error("log.metrics: cannot create '" + path + "'");
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("log.metrics: write to '" + path_ + "' failed");
}

}  // namespace ferry::runtime
