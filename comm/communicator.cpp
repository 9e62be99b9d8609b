#include "comm/communicator.h"

#include "base/env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ferry::comm {

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::f32: return 4;
    case DataType::f64: return 8;
    case DataType::i32: return 4;
    case DataType::u8: return 1;
    case DataType::u16: return 2;
  }
  return 0;
}

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::all_gather: return "all_gather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::broadcast: return "broadcast";
    case OpKind::barrier: return "barrier";
  }
  return "?";
}

namespace {
const char* type_name(DataType t) {
  switch (t) {
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::i32: return "i32";
    case DataType::u8: return "u8";
    case DataType::u16: return "u16";
  }
  return "?";
}
}  // namespace

size_t Op::bytes() const { return count * data_type_size(type); }

std::string Op::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s #%llu (%zu x %s = %zu bytes per rank)", op_name(kind),
                static_cast<unsigned long long>(seq), count, type_name(type), bytes());
  return buf;
}

WorkPtr Communicator::all_gather(const void* send, void* recv, size_t count, DataType type) {
  return submit({.kind = OpKind::all_gather, .send = send, .recv = recv, .count = count, .type = type});
}

WorkPtr Communicator::reduce_scatter(const void* send, void* recv, size_t count, DataType type, ReduceOp r) {
  return submit({.kind = OpKind::reduce_scatter, .send = send, .recv = recv, .count = count, .type = type, .reduce = r});
}

WorkPtr Communicator::all_reduce(void* buf, size_t count, DataType type, ReduceOp r) {
  return submit({.kind = OpKind::all_reduce, .recv = buf, .count = count, .type = type, .reduce = r});
}

WorkPtr Communicator::broadcast(void* buf, size_t count, DataType type, int root) {
  return submit({.kind = OpKind::broadcast, .recv = buf, .count = count, .type = type, .root = root});
}

WorkPtr Communicator::barrier() { return submit(Op{}); }

void Communicator::all_reduce_sum(std::span<double> values) {
  all_reduce(values.data(), values.size(), DataType::f64, ReduceOp::sum)->wait();
}

WorkPtr Communicator::submit(Op op) {
  // Argument checks: programmer errors, reported with the operation.
  const bool needs_data = op.kind != OpKind::barrier && op.count > 0;
  if (needs_data && op.recv == nullptr) throw std::invalid_argument(std::string(op_name(op.kind)) + ": null buffer");
  if (needs_data && (op.kind == OpKind::all_gather || op.kind == OpKind::reduce_scatter) && op.send == nullptr) {
    throw std::invalid_argument(std::string(op_name(op.kind)) + ": null send buffer");
  }
  if (op.kind == OpKind::broadcast && (op.root < 0 || op.root >= size())) {
    throw std::invalid_argument("broadcast: root " + std::to_string(op.root) + " outside [0, " + std::to_string(size()) + ")");
  }
  if (op.type == DataType::u16 && (op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter)) {
    throw std::invalid_argument(std::string(op_name(op.kind)) + ": u16 payloads are moved, never reduced");
  }
  if ((op.type == DataType::u8 || op.type == DataType::i32) && op.reduce == ReduceOp::avg &&
      (op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter)) {
    throw std::invalid_argument(std::string(op_name(op.kind)) + ": avg needs a floating type");
  }
  op.seq = ++seq_;
  {
    std::lock_guard<std::mutex> lock(recent_mu_);
    recent_[(op.seq - 1) % kRecent] = op;
  }
  auto work = std::make_shared<Work>("rank " + std::to_string(rank()) + ": " + op.describe());
  execute(op, work);
  // FERRY_CUDA_SYNC=1 (nn/cuda_check.h): a GPU collective is waited for where it is
  // issued, so a CUDA fault (NCCL's or an earlier kernel's) is reported next to it.
  static const bool sync_gpu = [] {
    const char* e = env_value("FERRY_CUDA_SYNC");
    return e && std::string(e) == "1";
  }();
  if (sync_gpu && name() == "nccl") work->wait();
  return work;
}

std::string Communicator::recent_ops() const {
  std::lock_guard<std::mutex> lock(recent_mu_);
  std::string out;
  const uint64_t first = seq_ > kRecent ? seq_ - kRecent + 1 : 1;
  for (uint64_t s = first; s <= seq_; ++s) out += "  " + recent_[(s - 1) % kRecent].describe() + "\n";
  return out;
}

void reduce_into(void* dst, const void* src, size_t n, DataType type) {
  switch (type) {
    case DataType::f32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) d[i] += s[i];
      return;
    }
    case DataType::f64: {
      double* d = static_cast<double*>(dst);
      const double* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) d[i] += s[i];
      return;
    }
    case DataType::i32: {
      int32_t* d = static_cast<int32_t*>(dst);
      const int32_t* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) d[i] += s[i];
      return;
    }
    case DataType::u8: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(d[i] + s[i]);
      return;
    }
    case DataType::u16: throw std::invalid_argument("u16 payloads are never reduced");
  }
}

void scale_by(void* buf, size_t n, DataType type, double factor) {
  if (type == DataType::f32) {
    float* p = static_cast<float*>(buf);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i] * factor);
  } else if (type == DataType::f64) {
    double* p = static_cast<double*>(buf);
    for (size_t i = 0; i < n; ++i) p[i] *= factor;
  }
}

void SingleProcessCommunicator::execute(const Op& op, const WorkPtr& work) {
  const size_t bytes = op.bytes();
  if ((op.kind == OpKind::all_gather || op.kind == OpKind::reduce_scatter) && bytes > 0 && op.send != op.recv) {
    std::memmove(op.recv, op.send, bytes);
  }
  work->complete();  // sums and averages over one rank are the values themselves
}

}  // namespace ferry::comm
