#include "testing/fake_communicator.h"

#include <cstring>

namespace ferry::testing {

FakeGroup::FakeGroup(int size) : size_(size), ops_(static_cast<size_t>(size)) {}

std::unique_ptr<Communicator> FakeGroup::communicator(int rank) {
  return std::make_unique<FakeCommunicator>(*this, rank);
}

void FakeGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = "the fake group was aborted: " + why;
  cv_.notify_all();
}

void FakeGroup::leave(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = "rank " + std::to_string(rank) + " left the fake group (it issues no more collectives)";
  cv_.notify_all();
}

void FakeGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  auto failed = [&] { return CommError(failure_); };  // the Work's message names the rank and the op
  if (!failure_.empty()) throw failed();
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || !failure_.empty(); });
  if (generation_ == gen) throw failed();
}

void FakeCommunicator::execute(const Op& op, const WorkPtr& work) {
  try {
    run(op, work);
  } catch (const CommError& e) {
    work->fail(e.what());
  }
}

void FakeCommunicator::run(const Op& op, const WorkPtr& work) {
  const int n = group_.size();
  group_.ops_[static_cast<size_t>(rank_)] = op;
  group_.arrive_and_wait();  // every rank's buffers are published
  std::string mismatch;
  for (int r = 0; r < n; ++r) {
    const Op& o = group_.ops_[static_cast<size_t>(r)];
    if (o.kind != op.kind || o.count != op.count || o.type != op.type || o.root != op.root) {
      mismatch = "rank " + std::to_string(r) + " issued " + o.describe() + " while rank " + std::to_string(rank_) +
                 " issued " + op.describe();
    }
  }
  const size_t bytes = op.bytes();
  std::vector<unsigned char> out;
  if (mismatch.empty()) {
    auto input = [&](int r) {
      const Op& o = group_.ops_[static_cast<size_t>(r)];
      return static_cast<const unsigned char*>(o.kind == OpKind::all_gather || o.kind == OpKind::reduce_scatter ? o.send : o.recv);
    };
    switch (op.kind) {
      case OpKind::all_gather:
        out.resize(bytes * static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) std::memcpy(out.data() + bytes * static_cast<size_t>(r), input(r), bytes);
        break;
      case OpKind::reduce_scatter:
      case OpKind::all_reduce: {
        const size_t offset = op.kind == OpKind::reduce_scatter ? bytes * static_cast<size_t>(rank_) : 0;
        out.assign(input(0) + offset, input(0) + offset + bytes);
        for (int r = 1; r < n; ++r) reduce_into(out.data(), input(r) + offset, op.count, op.type);
        if (op.reduce == ReduceOp::avg) scale_by(out.data(), op.count, op.type, 1.0 / n);
        break;
      }
      case OpKind::broadcast:
        out.assign(input(op.root), input(op.root) + bytes);
        break;
      case OpKind::barrier:
        break;
    }
  }
  group_.arrive_and_wait();  // every rank has read every input
  if (!mismatch.empty()) {
    work->fail(mismatch);
    return;
  }
  if (!out.empty()) std::memcpy(op.recv, out.data(), out.size());
  work->complete();
}

}  // namespace ferry::testing
