// Communicator: how ranks exchange host buffers.
//
// CONTRACT: every rank of a communicator issues the same collectives, in the same order,
// with the same counts and types. A rank that breaks it makes the others wait; the
// watchdog then ends the job with a message (never a silent hang).
//
// Every collective goes through one funnel (the non-virtual methods below): it checks the
// arguments, gives the call the next sequence number, records it in a ring of recent
// operations (for logs and traces) and hands it to the backend's execute(). Collectives
// return a Work that completes asynchronously on the MPI backend; the buffers must stay
// valid and untouched until it completes.
// Counts are in elements: all_gather's recv and reduce_scatter's send hold size()*count.
// Thread safety: issue collectives from one thread per communicator.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "comm/work.h"

namespace ferry::comm {

// u16: two-byte payloads (bf16 or f16 weights) that are gathered or broadcast, never reduced.
enum class DataType : uint8_t { f32, f64, i32, u8, u16 };
enum class ReduceOp : uint8_t { sum, avg };
enum class OpKind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier };

size_t data_type_size(DataType t);
const char* op_name(OpKind k);

struct Op {
  OpKind kind = OpKind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;  // all_reduce and broadcast work in place on recv
  size_t count = 0;
  DataType type = DataType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  uint64_t seq = 0;  // 1-based, per communicator
  size_t bytes() const;  // this rank's payload
  std::string describe() const;  // "reduce_scatter #12 (64.00 KiB f32 per rank)"
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this node (MPI_COMM_TYPE_SHARED), and this rank's index among them.
  virtual int local_rank() const { return rank(); }
  virtual int local_size() const { return size(); }
  virtual std::string name() const = 0;  // "mpi", "single", "fake"

  WorkPtr all_gather(const void* send, void* recv, size_t count, DataType type);
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op);
  WorkPtr all_reduce(void* buf, size_t count, DataType type, ReduceOp op);
  WorkPtr broadcast(void* buf, size_t count, DataType type, int root);
  WorkPtr barrier();

  // Device-side ordering (NCCL): instead of a host wait for a collective, the consumer's
  // stream is made to wait for that collective's completion on the device
  // (order_consumer(work)): for it and those issued before it on the backend's stream,
  // never for later ones. Host backends return false and order nothing.
  virtual bool orders_on_device() const { return false; }
  virtual void order_consumer(const Work& /*work*/) {}

  // Blocking conveniences.
  void all_reduce_sum(std::span<double> values);

  uint64_t sequence() const { return seq_; }
  // The most recent operations, oldest first (at most kRecent).
  std::string recent_ops() const;
  static constexpr size_t kRecent = 16;

 protected:
  // Runs `op` (arguments already checked) and completes `work`, now or later.
  virtual void execute(const Op& op, const WorkPtr& work) = 0;

 private:
  WorkPtr submit(Op op);
  uint64_t seq_ = 0;
  std::array<Op, kRecent> recent_{};
  mutable std::mutex recent_mu_;
};

// World size 1: every collective is a local copy.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }

 protected:
  void execute(const Op& op, const WorkPtr& work) override;
};

// Applies `reduce` of `n` elements of `type`: dst[i] += src[i]. Shared by the backends
// that reduce by hand.
void reduce_into(void* dst, const void* src, size_t n, DataType type);
void scale_by(void* buf, size_t n, DataType type, double factor);

}  // namespace ferry::comm
