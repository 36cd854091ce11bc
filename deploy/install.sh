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

cmake --install "$build_dir" --prefix "$prefix"
ldconfig  # libferry.so.1 for ferryctl and C/C++ users
if [[ $prefix != /usr ]]; then
  echo "note: the Python package went to $prefix/lib/python3/dist-packages, which Debian's" \
       "python3 does not search; add it to PYTHONPATH or install with --prefix /usr"
fi

unit_dir=/usr/lib/systemd/system
install -d "$unit_dir" /usr/lib/tmpfiles.d /usr/lib/sysusers.d /etc/ferry
# The unit names /usr/sbin/ferryd; follow the prefix when it is another one.
sed "s|/usr/sbin/ferryd|$prefix/sbin/ferryd|" deploy/systemd/ferryd.service \
  >"$unit_dir/ferryd.service"
chmod 0644 "$unit_dir/ferryd.service"
install -m 0644 deploy/systemd/ferry.tmpfiles.conf /usr/lib/tmpfiles.d/ferry.conf
install -m 0644 deploy/systemd/ferry.sysusers.conf /usr/lib/sysusers.d/ferry.conf
install -d "$prefix/share/doc/ferry"
install -m 0644 docs/*.md deploy/ferryd.conf.example "$prefix/share/doc/ferry/"
if [[ -e /etc/ferry/ferryd.conf ]]; then
  echo "kept existing /etc/ferry/ferryd.conf (the new example is in" \
       "$prefix/share/doc/ferry/ferryd.conf.example)"
else
  install -m 0644 deploy/ferryd.conf.example /etc/ferry/ferryd.conf
  echo "installed /etc/ferry/ferryd.conf from deploy/ferryd.conf.example; review" \
       "dataset_roots"
fi

# systemd is PID 1 on a booted machine; not in most containers or chroots.
if [[ -d /run/systemd/system ]]; then
  systemd-sysusers /usr/lib/sysusers.d/ferry.conf
  systemd-tmpfiles --create /usr/lib/tmpfiles.d/ferry.conf
  systemctl daemon-reload
  echo "installed. Start it:  systemctl enable --now ferryd"
  echo "let a user train:     usermod -aG ferry <user>   (then log in again)"
  echo "check it:             ferryctl --address /run/ferry/ferryd.sock status"
else
  echo "installed; systemd is not running here, so the ferry user and /run/ferry were not" \
       "created (systemd-sysusers and systemd-tmpfiles --create do that at boot)"
fi
