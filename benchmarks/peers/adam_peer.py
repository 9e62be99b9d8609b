"""DeepSpeed's CPU Adam, timed for `ferry bench adam --peers PYTHON` (benchmarks/bench_adam.cpp).

One fp32 parameter of `params` elements with a constant gradient, the hyperparameters of
ferry's benchmark (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01, AdamW mode), on
OMP_NUM_THREADS threads: DeepSpeed's op is built with its own OpenMP runtime, which reads
that variable once, so the caller starts one peer per thread count.

A long-running peer (benchmarks/peer_process.h): prints a ready line with the versions and
the threads, then answers one JSON line per request line on stdin:
  {"params": N, "reps": R} -> {"seconds": [R timed steps]}  (or {"error": "..."})
The first request of a size allocates the optimizer state and runs one untimed step (first
touch); later requests of the same size go on stepping the same state, so that ferry's
rounds and the peer's alternate. Everything else (imports, the op's JIT build, DeepSpeed's
logging) goes to stderr. Needs torch and deepspeed (scripts/make_peers_env.sh).
"""
import os
import time

from peer_protocol import claim_stdout, serve


def main():
    # Keep stdout for the JSON alone: fd 1 points at stderr while the libraries run.
    out = claim_stdout()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import torch
    import deepspeed
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)

    state = {}

    def answer(req):
        n = int(req["params"])
        if state.get("n") != n:
            state.clear()
            # The same inputs as ferry's benchmark: p = 0.01 (i % 1000), g = 1e-3 (i % 77) - 0.03.
            i = torch.arange(n, dtype=torch.int64)
            p = torch.nn.Parameter((i % 1000).to(torch.float32) * 0.01)
            p.grad = (i % 77).to(torch.float32) * 1e-3 - 0.03
            del i
            opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                   adamw_mode=True)
            opt.step()  # untimed: allocates exp_avg and exp_avg_sq
            state.update(n=n, p=p, opt=opt)
        seconds = []
        for _ in range(int(req["reps"])):
            t0 = time.perf_counter()
            state["opt"].step()
            seconds.append(time.perf_counter() - t0)
        return {"seconds": seconds}

    serve(out, {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "threads": threads}, answer)


if __name__ == "__main__":
    main()
