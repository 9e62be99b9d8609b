// The stack switch under the CUDA emulation's fibers (testing/cuda_emulation.h; tests only).
//
// Every __syncthreads, __syncwarp and shuffle of an emulated kernel is a switch between a
// thread's fiber and the block's scheduler: tens of millions per emulated training run.
// glibc's swapcontext saves and restores the signal mask on every switch, a system call:
// measured with perf on test_cuda_training_emulated, 86% of its time went to swapcontext and
// the kernel work under it. On x86-64 the switch here keeps only what the SysV ABI says a
// callee must preserve (rbx, rbp, r12-r15, the stack pointer, MXCSR and the x87 control
// word) and never enters the kernel; elsewhere it falls back to ucontext.
//
// Contract: one scheduler context per thread that runs blocks; a fiber is started with
// fiber_start on a stack it owns (aligned by fiber_start) and runs `entry`, which must never
// return: it ends by switching back to the scheduler. An exception must not leave `entry`
// (there is no frame above it to unwind to: the process terminates, as with ucontext).
// Not for sanitizer builds (ASan does not follow stack switches without annotations).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && !defined(FERRY_EMU_UCONTEXT)

extern "C" void ferry_emu_switch(void** save_sp, void* load_sp);

// Weak: every translation unit that includes this header emits the same routine and the
// linker keeps one. Pushes the callee-saved registers and the floating-point control state
// on the current stack, saves the stack pointer, loads the other one and pops its state.
asm(R"(
  .text
  .weak ferry_emu_switch
  .type ferry_emu_switch, @function
ferry_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ferry_emu_switch, .-ferry_emu_switch
)");

namespace ferry_emu {

struct FiberContext {
  void* sp = nullptr;
};

// Lays out a frame ferry_emu_switch pops into `entry`: the control state (the caller's),
// six zeroed registers, `entry` as the return address, and a null return address above it
// so that `entry` starts with the stack aligned as after a call (rsp = 8 mod 16).
inline void fiber_start(FiberContext& c, char* stack, size_t size, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;                                    // entry's own return address: it never returns
  *--slot = reinterpret_cast<uintptr_t>(entry);  // popped by ret
  for (int r = 0; r < 6; ++r) *--slot = 0;        // rbp, rbx, r12-r15
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--slot = 0;
  auto* control = reinterpret_cast<unsigned char*>(slot);
  __builtin_memcpy(control, &mxcsr, 4);
  __builtin_memcpy(control + 4, &fpucw, 2);
  c.sp = slot;
}

inline void fiber_switch(FiberContext& from, FiberContext& to) {
  ferry_emu_switch(&from.sp, to.sp);
}

}  // namespace ferry_emu

#else

#include <ucontext.h>

namespace ferry_emu {

struct FiberContext {
  ucontext_t uc{};
};

inline void fiber_start(FiberContext& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;  // entry never returns
  makecontext(&c.uc, entry, 0);
}

inline void fiber_switch(FiberContext& from, FiberContext& to) {
  swapcontext(&from.uc, &to.uc);
}

}  // namespace ferry_emu

#endif
