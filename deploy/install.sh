#!/usr/bin/env bash
# Installs a built ferry tree system-wide and sets up the ferryd service. Run as root
# after building (cmake --preset default && cmake --build --preset default):
#   sudo bash deploy/install.sh                 # build dir build/, prefix /usr
#   sudo bash deploy/install.sh --build-dir build-release --prefix /usr/local
# Then: systemctl enable --now ferryd; usermod -aG ferry <trainer user>.
# It changes the machine (files under the prefix, /usr/lib/systemd, /etc/ferry, a system
# user): never run it in CI. docs/operations.md explains each piece.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
prefix=/usr
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown argument '$1'; see: bash deploy/install.sh --help" >&2; exit 2 ;;
  esac
done

if [[ $(id -u) -ne 0 ]]; then
  echo "deploy/install.sh writes to $prefix and /usr/lib/systemd; run it as root (sudo)" >&2
  exit 1
fi
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  echo "no build in '$build_dir'; build first: cmake --preset default &&" \
       "cmake --build --preset default (or pass --build-dir)" >&2
  exit 1
fi

# The unit's ExecStart and the libdir follow the configured prefix: configure it first.
cmake -DCMAKE_INSTALL_PREFIX="$prefix" "$build_dir" >/dev/null
# Binaries, libraries, headers, the Python package, the systemd unit, sysusers and tmpfiles
# entries, docs; /etc/ferry/ferryd.conf only when there is none (see deploy/CMakeLists.txt).
cmake --install "$build_dir"
ldconfig  # libferry.so.1 and libferry_client.so.0 for C/C++ users and the Python package
if [[ $prefix != /usr ]]; then
  echo "note: the Python package went to $prefix/lib/python3/dist-packages, which Debian's" \
       "python3 does not search; add it to PYTHONPATH or install with --prefix /usr"
fi
sysconf=/etc
[[ $prefix == /usr ]] || sysconf=$prefix/etc

# systemd is PID 1 on a booted machine; not in most containers or chroots.
if [[ -d /run/systemd/system ]]; then
  systemd-sysusers ferry.conf
  systemd-tmpfiles --create ferry.conf
  systemctl daemon-reload
  echo "installed. Review dataset_roots in $sysconf/ferry/ferryd.conf, then start it:"
  echo "                      systemctl enable --now ferryd"
  echo "let a user train:     usermod -aG ferry <user>   (then log in again)"
  echo "check it:             ferryctl --address /run/ferry/ferryd.sock status"
else
  echo "installed; systemd is not running here, so the ferry user and /run/ferry were not" \
       "created (systemd-sysusers and systemd-tmpfiles --create do that at boot)"
fi
