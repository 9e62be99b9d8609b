"""DeepSpeed's CPU Adam, timed for `ferry bench adam --peers PYTHON` (benchmarks/bench_adam.cpp).

One fp32 parameter of --params elements with a constant gradient, the hyperparameters of
ferry's benchmark (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01, AdamW mode),
--threads threads (torch.set_num_threads; the caller also sets OMP_NUM_THREADS, which is
what DeepSpeed's OpenMP loop reads). One untimed step first (it allocates and first-touches
the optimizer state), then --reps timed steps. Prints one JSON object on stdout:
  {"params": N, "threads": T, "seconds": [...], "torch": "...", "deepspeed": "..."}
Everything else the imports, the JIT build of the op or DeepSpeed's logging print goes to
stderr, so that stdout holds only the JSON. Exits non-zero with the cause on stderr.
Needs torch and deepspeed (scripts/make_peers_env.sh makes such a Python).
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, required=True)
    args = ap.parse_args()

    # Keep stdout for the JSON alone: fd 1 points at stderr while the libraries run.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import torch
    import deepspeed
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    torch.set_num_threads(args.threads)
    n = args.params
    # The same inputs as ferry's benchmark: p = 0.01 (i % 1000), g = 1e-3 (i % 77) - 0.03.
    i = torch.arange(n, dtype=torch.int64)
    p = torch.nn.Parameter((i % 1000).to(torch.float32) * 0.01)
    p.grad = (i % 77).to(torch.float32) * 1e-3 - 0.03
    del i
    opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                           adamw_mode=True)
    opt.step()  # untimed: allocates exp_avg and exp_avg_sq
    seconds = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - t0)
    out.write(json.dumps({"params": n, "threads": args.threads, "seconds": seconds,
                          "torch": torch.__version__, "deepspeed": deepspeed.__version__}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
