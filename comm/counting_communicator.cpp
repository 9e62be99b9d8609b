#include "comm/counting_communicator.h"

#include <stdexcept>

namespace ferry::comm {

CountingCommunicator::CountingCommunicator(int rank, int size) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("CountingCommunicator: rank " + std::to_string(rank) + " of world size " +
                                std::to_string(size));
  }
}

void CountingCommunicator::execute(const Op& op, const WorkPtr& work) {
  ++ops_[static_cast<size_t>(op.kind)];
  bytes_[static_cast<size_t>(op.kind)] += op.bytes();
  work->complete();
}

}  // namespace ferry::comm
