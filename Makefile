# ferry's front door. CMake is the real build; this file names the jobs.
#   make run     install what is missing, build, train the tiny GPT on the bundled corpus
#   make test    install what is missing, build, run every test (release build, then ASan+UBSan build,
#                then the parsers' fuzz targets briefly: make test-fuzz), each build beside the
#                tests before it
#   make test-tsan  build with ThreadSanitizer, run the tests that start threads (not part of make test)
#   make bench   run the benchmarks (ferry bench model, attention, comm, adam, io, ckpt, step, lora), JSON results under out/
#   make clean   remove build folders and outputs
# Tests run two at a time (ctest -j$(JOBS)) with OpenMP's passive wait policy: its default
# spin-waiting threads of two processes sharing two cores slow each other down a hundredfold,
# and threads that sleep at barriers do not. Tests of several ranks or of timing run alone
# (RUN_SERIAL, tests/CMakeLists.txt). Each stage prints its start time ([make] lines).
JOBS    ?= $(shell nproc)
BUILD   ?= build
ASAN    ?= build-asan
FUZZ    ?= build-fuzz
TSAN    ?= build-tsan
CMAKE_FLAGS ?=
CONFIG  ?= examples/configs/tiny.json

.PHONY: all setup build build-ferry build-asan build-fuzz run test test-release test-asan test-fuzz build-tsan test-tsan bench clean

all: build

setup:
	@bash scripts/setup.sh

# Build folders made here compile each library as one unit (cmake/build_time.cmake), with
# Ninja: it starts any object whose inputs exist, where CMake's Makefiles build target after
# target (one core idle while a library's one unit compiled, measured on CI's two cores).
UNITY   ?= -DFERRY_UNITY_BUILD=ON
GEN     ?= -G Ninja

# FERRY_SPLIT_TESTS, on in both folders of make test: each Boost unit test case runs in one
# of them, the sanitizer build but for a few cases that take minutes there (tests/CMakeLists.txt);
# here the unit tests are targets built on demand (cmake --build build --target test_hf).
$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(GEN) -DCMAKE_BUILD_TYPE=Release $(UNITY) -DFERRY_SPLIT_TESTS=ON $(CMAKE_FLAGS)

STAGE = @echo "[make] $$(date +%T) $@"
CTEST = OMP_WAIT_POLICY=passive ctest -j $(JOBS) --output-on-failure

build: setup $(BUILD)/CMakeCache.txt
	$(STAGE)
	cmake --build $(BUILD) -j $(JOBS)

# The sanitizer build leaves the CUDA parts out: they cannot run without a GPU, the release
# build already compiles them with -Werror, and ASan's shadow memory and the CUDA driver
# need special settings to share a process. It is clang's (which make test-fuzz needs
# anyway): the same build took about 8 minutes against GCC's 13-14 on CI's two cores, and
# two compilers see more than one (docs/design/testing.md, "CI time").
$(ASAN)/CMakeCache.txt:
	cmake -S . -B $(ASAN) $(GEN) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE=ON -DFERRY_CUDA=OFF $(UNITY) -DFERRY_SPLIT_TESTS=ON $(CMAKE_FLAGS)

build-asan: setup $(ASAN)/CMakeCache.txt
	$(STAGE)
	cmake --build $(ASAN) -j $(JOBS)

# make run builds the one program it runs (not the tests nor the emulated CUDA objects).
build-ferry: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target ferry

run: build-ferry
	@mkdir -p out
	$(BUILD)/examples/ferry train --config $(CONFIG) --set log.metrics=out/tiny-metrics.jsonl

test-release: build
	$(STAGE)
	cd $(BUILD) && $(CTEST)

test-asan: build-asan
	$(STAGE)
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(CTEST)

# ThreadSanitizer over the tests that start threads (ctest label tsan, tests/CMakeLists.txt);
# only their executables are built. CUDA is left out, as in the ASan build. Each process
# writes its reports under $(TSAN)/tsan-reports/ rather than to stderr, so that those of
# ranks under mpiexec and of the fault scripts (which keep part of their output) are seen
# too: any report fails the target and is printed whole. halt_on_error: the first report
# ends the process; second_deadlock_stack: both stacks of a lock-order inversion. What is
# suppressed and why: tests/tsan.supp. TSAN_CTEST_ARGS="-R test_offload" runs some of them.
TSAN_DIR = $(abspath $(TSAN))
$(TSAN)/CMakeCache.txt:
	cmake -S . -B $(TSAN) $(GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_TSAN=ON -DFERRY_CUDA=OFF $(CMAKE_FLAGS)

build-tsan: setup $(TSAN)/CMakeCache.txt
	cmake --build $(TSAN) -j $(JOBS) --target tsan_tests

test-tsan: build-tsan
	rm -rf $(TSAN_DIR)/tsan-reports && mkdir -p $(TSAN_DIR)/tsan-reports
	cd $(TSAN) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp:log_path=$(TSAN_DIR)/tsan-reports/report \
	  ctest -L tsan --output-on-failure $(TSAN_CTEST_ARGS); status=$$?; \
	  if ls $(TSAN_DIR)/tsan-reports/report.* >/dev/null 2>&1; then \
	    cat $(TSAN_DIR)/tsan-reports/report.*; echo "make test-tsan: ThreadSanitizer reports above"; exit 1; \
	  fi; exit $$status

# The fuzz targets of every parser of outside input (tests/fuzz/), built with clang's
# libFuzzer, ASan and UBSan: only the parsers and what they call are compiled. Each target
# runs 3000 executions over its seed corpus (FUZZ_RUNS=N for more); FUZZ_SECONDS=S runs each
# for S seconds instead, keeping the corpus it grows under $(FUZZ)/fuzz-corpus/.
$(FUZZ)/CMakeCache.txt:
	cmake -S . -B $(FUZZ) $(GEN) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_FUZZ=ON -DFERRY_CUDA=OFF $(CMAKE_FLAGS)

build-fuzz: setup $(FUZZ)/CMakeCache.txt
	$(STAGE)
	cmake --build $(FUZZ) -j $(JOBS)

test-fuzz: build-fuzz
	$(STAGE)
	FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_SECONDS=$(FUZZ_SECONDS) bash tests/fuzz/run_fuzzers.sh $(FUZZ)

# make test: the release build, then each test stage with the next stage's build beside it
# at the lowest priority (nice 19): the build takes only the cycles the tests leave idle
# (a test of one process that runs alone, the last long test), so the tests' timings are
# theirs and the cores stay busy. A build beside writes to its log, shown when it fails
# and summed up by its [make] lines when it ends. Measured: docs/design/testing.md, "CI time".
test: build
	$(call beside,test-release,build-asan,$(ASAN)/build.log)
	$(call beside,test-asan,build-fuzz,$(FUZZ)/build.log)
	@$(MAKE) --no-print-directory test-fuzz
	$(STAGE) done

# $(call beside,TARGET,BUILD,LOG): make TARGET while make BUILD runs at nice 19 into LOG;
# fails if either does (a failed TARGET, or an interrupt, stops BUILD at once). Like every
# recipe line naming $(MAKE), this one runs under make -n too. setsid gives BUILD a process
# group to stop, and with it a session: where the kernel groups sessions for scheduling
# (autogroup, /proc/sys/kernel/sched_autogroup_enabled), a nice value counts only inside its
# group and the two groups would share the cores half and half (measured: the tests at 55%,
# the build at 45%); the group's own nice (/proc/self/autogroup) puts BUILD behind again.
define beside
	@mkdir -p $(dir $(3)); echo "[make] $$(date +%T) $(2) beside $(1), at nice 19 (its output: $(3))"
	@setsid nice -n 19 sh -c 'echo 19 2>/dev/null >/proc/self/autogroup; \
	    $(MAKE) --no-print-directory $(2); st=$$?; echo "[make] $$(date +%T) $(2) ended"; exit $$st' \
	    >$(3) 2>&1 & bg=$$!; \
	  trap 'kill -TERM -$$bg 2>/dev/null; exit 130' INT TERM HUP; \
	  $(MAKE) --no-print-directory $(1); fg=$$?; \
	  if [ $$fg -ne 0 ]; then kill -TERM -$$bg 2>/dev/null; wait $$bg; exit $$fg; fi; \
	  wait $$bg; st=$$?; grep '^\[make\]' $(3) | sed 's/$$/ (beside)/'; \
	  if [ $$st -ne 0 ]; then tail -n 80 $(3); echo "make: $(2) failed beside $(1) (its whole output: $(3))"; fi; \
	  exit $$st
endef

# With FERRY_PEERS_PYTHON exported (scripts/make_peers_env.sh prints it), model, adam, io and
# step also measure their peers in the same run (PyTorch eager and FSDP2, DeepSpeed's CPU
# Adam, aio and ZeRO-Infinity), and attention PyTorch's SDPA.
bench: build
	@mkdir -p out
	$(BUILD)/examples/ferry bench model --ranks 2 --json out/bench-model.json
	$(BUILD)/examples/ferry bench attention $(if $(FERRY_PEERS_PYTHON),--python '$(FERRY_PEERS_PYTHON)') --json out/bench-attention.json
	mpiexec -n 2 $(BUILD)/examples/ferry bench comm --json out/bench-comm.json
	$(BUILD)/examples/ferry bench adam --json out/bench-adam.json
	$(BUILD)/examples/ferry bench io --path out --json out/bench-io.json
	$(BUILD)/examples/ferry bench ckpt --path out --json out/bench-ckpt.json
	$(BUILD)/examples/ferry bench step --nvme-path out --json out/bench-step.json
	$(BUILD)/examples/ferry bench lora --json out/bench-lora.json

clean:
	rm -rf $(BUILD) $(ASAN) $(FUZZ) $(TSAN) out
