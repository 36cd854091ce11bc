#!/usr/bin/env bash
# The plain `cmake -B build && cmake --build build` (CMake's default generator, no preset)
# configures, and builds the targets that once broke it: ferry_kernels (its kernels made the
# Makefile generator ask nvcc for a C++20 dialect CMake 3.25 cannot name) and the client
# library (with ferry_cuda, the CUDA owners it links). The full build is the presets' job;
# this keeps the plain one from rotting.
#   plain_cmake_test.sh SOURCE_DIR
set -euo pipefail
src=$(realpath "$1")
work=$(mktemp -d /tmp/ferry-plain-cmake.XXXXXX)
trap 'rm -rf "$work"' EXIT
env -u CMAKE_GENERATOR cmake -S "$src" -B "$work/build" -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
grep -q "CMAKE_GENERATOR:INTERNAL=Unix Makefiles" "$work/build/CMakeCache.txt"
targets=(ferry_client_shared)
if grep -q "ferry: CUDA transport ON" "$work/configure.log"; then targets+=(ferry_kernels); fi
cmake --build "$work/build" -j"$(nproc)" --target "${targets[@]}" >"$work/build.log" 2>&1 \
  || { tail -50 "$work/build.log"; exit 1; }
echo "plain cmake: configured with Unix Makefiles and built ${targets[*]}"
