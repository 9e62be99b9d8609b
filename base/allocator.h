// Which allocator the process runs on, for the banner and for the test that checks it.
#pragma once

#include <string>

namespace ferry {

// "mimalloc 2.0.9" when ferry was linked with mimalloc, else "system malloc (sanitizer build)".
std::string allocator_name();
// True when memory from plain malloc() comes from mimalloc's heap.
bool malloc_is_mimalloc();
// Keeps memory the process frees committed for its next allocation instead of returning it
// to the system after mimalloc's delay (25 ms): a training step frees and allocates the
// same tensors every step (the CPU device's activations and gradients, the GEMM's packed
// operands), and each return cost a page fault per 4 KiB at the next step, a tenth of a
// LoRA step on two cores (docs/design/measured.md). The resident size then stays at the
// run's peak, which is what `ferry plan` budgets. (Blocks of tens of MiB live in segments of
// their own, which mimalloc 2.0 may still unmap.) The programs' mains call it
// (examples/cli.cpp); nothing without mimalloc.
void keep_freed_memory();

}  // namespace ferry
