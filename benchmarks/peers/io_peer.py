"""DeepSpeed's async I/O, timed for `ferry bench io --peers PYTHON` (benchmarks/bench_io.cpp).

DeepSpeed's aio_handle (libaio, O_DIRECT, the engine of ZeRO-Infinity's NVMe swapping and of
its ds_io benchmark) reads or writes a whole file from or into one page-locked buffer with
the request's block size and queue depth: single_submit off, overlap_events on,
intra_op_parallelism 1 (ds_io's defaults). A write ends with fdatasync, as ferry's and
fio's (--end_fsync=1) do, so that the three time the same work.

A long-running peer (benchmarks/peer_process.h): prints a ready line with the versions,
then answers one JSON line per request line on stdin:
  {"op": "read"|"write", "path": FILE, "bytes": N, "block_size": B, "queue_depth": Q}
  -> {"seconds": S}  (or {"error": "..."})
Everything else (imports, the op's JIT build, DeepSpeed's logging) goes to stderr.
Needs torch and deepspeed with libaio (scripts/make_peers_env.sh makes such a Python).
"""
import os
import time

from peer_protocol import claim_stdout, serve


def main():
    out = claim_stdout()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import torch
    import deepspeed
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load()

    def answer(req):
        write = req["op"] == "write"
        handle = aio.aio_handle(req["block_size"], req["queue_depth"], False, True, 1)
        buf = handle.new_cpu_locked_tensor(req["bytes"], torch.empty(0, dtype=torch.uint8))
        try:
            if write:
                buf.random_(0, 256)
            t0 = time.perf_counter()
            if write:
                ret = handle.sync_pwrite(buf, req["path"])
                fd = os.open(req["path"], os.O_WRONLY)
                os.fdatasync(fd)
                os.close(fd)
            else:
                ret = handle.sync_pread(buf, req["path"])
            seconds = time.perf_counter() - t0
        finally:
            handle.free_cpu_locked_tensor(buf)
        if ret == -1:
            return {"error": "aio_handle %s of %s failed" % (req["op"], req["path"])}
        else:
            return {"seconds": seconds}

    serve(out, {"torch": torch.__version__, "deepspeed": deepspeed.__version__}, answer)


if __name__ == "__main__":
    main()
