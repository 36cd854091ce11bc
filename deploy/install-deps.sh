#!/usr/bin/env bash
# Installs everything ferry needs to build, test and run on Debian 12, from Debian's own
# packages. Used by the README's Quick start, by .ci/run and by the Dockerfile.
#   deploy/install-deps.sh            build + test + runtime dependencies, clang with its
#                                     sanitizer and libFuzzer runtimes (scripts/sanitize.sh),
#                                     and what the install tests use (venv, pip, setuptools,
#                                     wheel; dpkg-dev for CPack's dependency scan; Node.js
#                                     and npm for the S3-compatible test server, unless the
#                                     machine has them already)
set -euo pipefail
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
  libnuma-dev libjpeg62-turbo-dev libspng-dev libsystemd-dev libarchive-dev libcpp-httplib-dev libcurl4-openssl-dev libexpat1-dev \
  libgtest-dev libgmock-dev libbenchmark-dev clang clang-format libclang-rt-14-dev \
  python3 python3-numpy python3-torch python3-torchvision python3-pil python3-pytest \
  python3-venv python3-pip python3-setuptools python3-wheel dpkg-dev
if ! command -v npm > /dev/null; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
