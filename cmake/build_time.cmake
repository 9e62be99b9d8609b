# How long ferry takes to build, decided in one place (docs/design/testing.md, "CI time").
# `make test` builds ferry twice on CI's two cores (release, then ASan+UBSan); measured per
# translation unit (ninja's log), optimization was half of a unit's compile time and the
# headers every unit parses (nlohmann's JSON, the standard library, CLI11) a quarter.
# Included at the end of the top-level CMakeLists.txt: it walks every target defined above.
#
# 1. Code whose speed no run feels compiles at -O1 in optimized builds: the command line
#    (ferry_cli and the two programs), the configuration readers (ferry_config), the tools
#    (plan, doctor, launch, plot, the config writer) and the tests' own code (the library
#    code they test keeps its level). Kernels, tiers, communicators, the training loop,
#    tokenizers, checkpoints and the benchmarks (they time their own loops) keep -O3.
# 2. The sanitizer build compiles at -O1 with line tables only (-g1: ASan's and UBSan's
#    reports keep file:line, the full debug information took a third of that build), and
#    the two libraries every test spends its time in (nn's Eigen kernels, offload's Adam)
#    at -O2, where Eigen is usable. The tests' own code (their checks and fixtures, not
#    ferry's code they call) is compiled with ASan but without UBSan: GCC's UBSan took 43%
#    of a test's compile time (test_config.cpp: 61 s with it, 35 s without), and the code
#    it is there to check, every library, keeps it.
# 3. Unity builds (FERRY_UNITY_BUILD, on in the build folders the Makefile creates): each
#    library compiles as one translation unit, so its headers are parsed and its templates
#    instantiated and optimized once. Files whose file-local names meet another file's
#    (measured: a "redefinition" error in the joined unit) stay apart, listed below; a new
#    clash fails the build naming both definitions: rename, or add the file to the list.
#    Off by default for a folder configured by hand: while iterating on one file, the
#    library's other files need not recompile with it.
# 4. Precompiled headers: each library of several units precompiles the standard headers
#    and nlohmann's JSON once; the tests share one (REUSE_FROM, their flags being alike).
#    Boost.Test stays out: its header generates main() when BOOST_TEST_MODULE is defined
#    before it, in each test's own first lines.

function(ferry_targets_under out dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(s ${subdirs})
    ferry_targets_under(sub ${s})
    list(APPEND targets ${sub})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

set(FERRY_PCH_HEADERS
    <algorithm> <chrono> <cstdint> <cstring> <filesystem> <fstream> <functional> <iostream>
    <map> <memory> <mutex> <optional> <sstream> <string> <thread> <unordered_map> <vector>
    <nlohmann/json.hpp>)
set(FERRY_COLD_TARGETS ferry_cli ferry ferry-train ferry_config ferry_tools)
option(FERRY_UNITY_BUILD "Compile each library as one translation unit (the Makefile's build folders turn it on)" OFF)
# Files that keep their own translation unit in a unity build, and the clash that put them here.
# ferry_nn stays out whole: its files share little beyond Eigen and each holds file-local
# kernels and tensor tables under like names (gpt.cpp, llama.cpp, the cuda device's files).
set(FERRY_UNITY_APART
    # The emulated tests link their own build of these ahead of the libraries
    # (tests/trainer_emulated.cpp): as archive members of their own they are left out there.
    runtime/train/trainer.cpp
    runtime/train/engine.cpp
    comm/nccl_communicator.cpp
    runtime/text/tokenizer.cpp     # Tokenizer::Impl holds types of its file's anonymous namespace
    runtime/tools/doctor_gpu.cpp   # make() and bytes(), as doctor.cpp's
    benchmarks/bench_adam.cpp      # range(), as bench_model.cpp's
    benchmarks/bench_ckpt.cpp      # seconds_since(), as bench_model.cpp's
    benchmarks/bench_step.cpp)     # seconds_since()
foreach(f ${FERRY_UNITY_APART})
  get_filename_component(dir ${PROJECT_SOURCE_DIR}/${f} DIRECTORY)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/${f} DIRECTORY ${dir} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endforeach()

ferry_targets_under(FERRY_ALL_TARGETS ${PROJECT_SOURCE_DIR})
set(FERRY_TEST_PCH_FROM "")
foreach(t ${FERRY_ALL_TARGETS})
  get_target_property(type ${t} TYPE)
  if(NOT type MATCHES "STATIC_LIBRARY|EXECUTABLE|OBJECT_LIBRARY")
    continue()
  endif()
  get_target_property(sources ${t} SOURCES)
  set(cu_sources ${sources})
  list(FILTER sources INCLUDE REGEX "\\.cpp$")
  list(FILTER cu_sources INCLUDE REGEX "\\.cu$")
  list(LENGTH sources n_cpp)
  if(n_cpp EQUAL 0 OR cu_sources)
    continue()  # the CUDA kernels' libraries: nvcc's flags are its own (cmake/cuda.cmake)
  endif()
  get_target_property(defs ${t} COMPILE_DEFINITIONS)
  set(emulated OFF)
  if(defs AND "FERRY_CUDA_EMULATION=1" IN_LIST defs)
    set(emulated ON)  # the shim's macros meet the kernels' sources: nothing forced ahead of them
  endif()
  set(is_test OFF)
  if(t MATCHES "^test_" OR t MATCHES "^fuzz_")
    set(is_test ON)
  endif()

  if(CMAKE_BUILD_TYPE STREQUAL "Release" AND NOT emulated AND (is_test OR t IN_LIST FERRY_COLD_TARGETS))
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  endif()
  if(FERRY_SANITIZE AND t MATCHES "^ferry_(nn|offload)$")
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O2>)
  endif()
  if(FERRY_SANITIZE AND NOT FERRY_FUZZ AND t MATCHES "^test_")
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize=undefined>)
  endif()

  if(emulated OR FERRY_FUZZ)
    continue()
  endif()
  if(is_test)
    if(FERRY_TEST_PCH_FROM STREQUAL "")
      set(FERRY_TEST_PCH_FROM ${t})
      target_precompile_headers(${t} PRIVATE ${FERRY_PCH_HEADERS})
    else()
      target_precompile_headers(${t} REUSE_FROM ${FERRY_TEST_PCH_FROM})
    endif()
  elseif(n_cpp GREATER 1)
    target_precompile_headers(${t} PRIVATE ${FERRY_PCH_HEADERS})
    if(FERRY_UNITY_BUILD AND type STREQUAL "STATIC_LIBRARY" AND NOT t STREQUAL "ferry_nn")
      set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
    endif()
  endif()
endforeach()
