# ferry's front door. CMake is the real build; this file names the jobs.
#   make run     install what is missing, build, train the tiny GPT on the bundled corpus
#   make test    install what is missing, build, run every test (release build, then ASan+UBSan build)
#   make bench   run the benchmarks (ferry bench model, attention, comm, adam, io, ckpt, step), JSON results under out/
#   make clean   remove build folders and outputs
# Tests run one at a time: OpenMP's spin-waiting threads of two test processes sharing two
# cores slow each other down a hundredfold.
JOBS    ?= $(shell nproc)
BUILD   ?= build
ASAN    ?= build-asan
CMAKE_FLAGS ?=
CONFIG  ?= examples/configs/tiny.json

.PHONY: all setup build build-asan run test test-release test-asan bench clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The sanitizer build leaves the CUDA parts out: they cannot run without a GPU, the release
# build already compiles them with -Werror, and ASan's shadow memory and the CUDA driver
# need special settings to share a process.
$(ASAN)/CMakeCache.txt:
	cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE=ON -DFERRY_CUDA=OFF $(CMAKE_FLAGS)

build-asan: setup $(ASAN)/CMakeCache.txt
	cmake --build $(ASAN) -j $(JOBS)

run: build
	@mkdir -p out
	$(BUILD)/examples/ferry train --config $(CONFIG) --set log.metrics=out/tiny-metrics.jsonl

test-release: build
	cd $(BUILD) && ctest --output-on-failure

test-asan: build-asan
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure

test: test-release test-asan

bench: build
	@mkdir -p out
	$(BUILD)/examples/ferry bench model --json out/bench-model.json
	$(BUILD)/examples/ferry bench attention --json out/bench-attention.json
	mpiexec -n 2 $(BUILD)/examples/ferry bench comm --json out/bench-comm.json
	$(BUILD)/examples/ferry bench adam --json out/bench-adam.json
	$(BUILD)/examples/ferry bench io --path out --json out/bench-io.json
	$(BUILD)/examples/ferry bench ckpt --path out --json out/bench-ckpt.json
	$(BUILD)/examples/ferry bench step --nvme-path out --json out/bench-step.json

clean:
	rm -rf $(BUILD) $(ASAN) out
