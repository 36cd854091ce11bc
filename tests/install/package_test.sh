#!/usr/bin/env bash
# The Debian packages (CPack) of a build: builds them, checks what each holds, unpacks them
# into a scratch root (dpkg -x: a container-like prefix, nothing installed on this machine),
# then runs the installed ferryd and, against it, the installed Python package's Loader, the
# out-of-tree C++ example (examples/cpp, find_package(ferry) -> ferry::client) and a C
# program built with pkg-config. Nothing may come from the build tree.
#   package_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(realpath "$1")
build=$(realpath "$2")
work=$(mktemp -d /tmp/ferry-package-test.XXXXXX)
daemon_pid=
cleanup() {
  if [[ -n $daemon_pid ]]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "package test: $*" >&2; exit 1; }
# Whether the text $1 contains the fixed string $2. The text is taken whole first: `cmd |
# grep -q` fails under pipefail whenever grep exits at its match while cmd still writes.
contains() { grep -qF -- "$2" <<<"$1"; }

cpack --config "$build/CPackConfig.cmake" -B "$work/pkgs" >"$work/cpack.log" 2>&1 \
  || { cat "$work/cpack.log"; fail "cpack failed"; }
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
declare -A deb=(
  [ferryd]="$work/pkgs/ferryd_0.1.0_$arch.deb"
  [libferry1]="$work/pkgs/libferry1_0.1.0_$arch.deb"
  [libferry-dev]="$work/pkgs/libferry-dev_0.1.0_$arch.deb"
  [python3-ferry]="$work/pkgs/python3-ferry_0.1.0_all.deb")
for name in "${!deb[@]}"; do
  [[ -f ${deb[$name]} ]] || { ls "$work/pkgs"; fail "no package $name"; }
done

# What each package must hold (dpkg-deb -c lists ./path).
expect() {
  local name=$1; shift
  local listing; listing=$(dpkg-deb -c "${deb[$name]}")
  for path in "$@"; do
    grep -qE " \./${path#/}( |$)" <<<"$listing" || fail "$name lacks $path"
  done
}
expect ferryd /usr/sbin/ferryd /usr/bin/ferryctl /usr/lib/systemd/system/ferryd.service \
  /usr/lib/sysusers.d/ferry.conf /usr/lib/tmpfiles.d/ferry.conf /etc/ferry/ferryd.conf \
  /usr/share/doc/ferry/examples/ferryd.conf.example /usr/share/doc/ferry/operations.md
expect libferry1 "/usr/lib/$multiarch/libferry.so.1.0.0" \
  "/usr/lib/$multiarch/libferry_client.so.0.1.0"
expect libferry-dev /usr/include/ferry/ferry.h /usr/include/ferry/client.h \
  /usr/include/ferry/consumer.h /usr/include/ferry/batch.h /usr/include/ferry/epoch.h \
  /usr/include/ferry/v1/ferry.pb.h /usr/include/ferry/v1/dtype.h \
  "/usr/lib/$multiarch/pkgconfig/ferry.pc" "/usr/lib/$multiarch/pkgconfig/ferry-client.pc" \
  "/usr/lib/$multiarch/cmake/ferry/ferryConfig.cmake"
expect python3-ferry /usr/lib/python3/dist-packages/ferry/__init__.py
if contains "$(dpkg-deb -c "${deb[python3-ferry]}")" 'libferry.so'; then
  fail "python3-ferry carries its own libferry.so (it must use libferry1's)"
fi
# Control data: dependencies between the packages, maintainer scripts, the conffile.
contains "$(dpkg-deb -f "${deb[python3-ferry]}" Depends)" 'libferry1 (= 0.1.0)' \
  || fail "python3-ferry does not depend on libferry1"
contains "$(dpkg-deb -f "${deb[libferry-dev]}" Depends)" 'libferry1 (= 0.1.0)' \
  || fail "libferry-dev does not depend on libferry1"
contains "$(dpkg-deb -f "${deb[libferry-dev]}" Depends)" 'libprotobuf-dev' \
  || fail "libferry-dev does not depend on libprotobuf-dev (ferry/v1/ferry.pb.h needs it)"
contains "$(dpkg-deb -f "${deb[ferryd]}" Depends)" 'libgrpc' \
  || fail "ferryd's Depends (from dpkg-shlibdeps) lack gRPC"
mkdir "$work/control"
dpkg-deb -e "${deb[ferryd]}" "$work/control"
for f in postinst prerm postrm conffiles; do
  [[ -f $work/control/$f ]] || fail "ferryd has no $f"
done
grep -qx /etc/ferry/ferryd.conf "$work/control/conffiles" || fail "ferryd.conf is no conffile"
sh -n "$work/control/postinst"

root=$work/root
for name in "${!deb[@]}"; do dpkg -x "${deb[$name]}" "$root"; done
libdir=$root/usr/lib/$multiarch

# The installed daemon, on a private socket.
mkdir -m 0700 "$work/run"
printf 'unix_socket_mode: 384\n' >"$work/ferryd.conf"
"$root/usr/sbin/ferryd" --config "$work/ferryd.conf" --listen "$work/run/ferryd.sock" \
  >"$work/ferryd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  "$root/usr/bin/ferryctl" --address "$work/run/ferryd.sock" status >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/ferryd.log"; fail "installed ferryd died"; }
  sleep 0.1
done
"$root/usr/bin/ferryctl" --address "$work/run/ferryd.sock" status >/dev/null \
  || { cat "$work/ferryd.log"; fail "installed ferryd does not answer"; }

cd "$work"
# Python: the installed package loads the installed libferry.so.1 through the dynamic
# linker (LD_LIBRARY_PATH stands in for ldconfig's cache of a real install).
env -u PYTHONPATH -u FERRY_LIBRARY -u FERRY_DAEMON \
  PYTHONPATH="$root/usr/lib/python3/dist-packages" LD_LIBRARY_PATH="$libdir" \
  /usr/bin/python3 "$src/tests/install/check_loader.py" --expect-under "$root" \
  --address "$work/run/ferryd.sock"

# C++: the example builds out of tree against the installed CMake package.
cmake -S "$src/examples/cpp" -B "$work/example" -DCMAKE_PREFIX_PATH="$root/usr" \
  >"$work/example.log" 2>&1 || { cat "$work/example.log"; fail "examples/cpp does not configure"; }
cmake --build "$work/example" >>"$work/example.log" 2>&1 \
  || { cat "$work/example.log"; fail "examples/cpp does not build"; }
/usr/bin/python3 -c "import numpy; numpy.arange(500, dtype=numpy.int64).tofile('$work/records.bin')"
contains "$(LD_LIBRARY_PATH="$libdir" ldd "$work/example/ferry_read_records")" \
  "$libdir/libferry_client.so.0" \
  || fail "examples/cpp is not linked against the installed libferry_client"
LD_LIBRARY_PATH="$libdir" "$work/example/ferry_read_records" "$work/run/ferryd.sock" \
  "$work/records.bin" 16 | tee "$work/example.out"
grep -qx "read 500 records in 32 batches" "$work/example.out" || fail "examples/cpp read wrong"

# C: pkg-config finds the installed headers and library.
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -Wall -Werror -o "$work/ferry_c_test" "$src/client/c/ferry_c_test.c" \
  $(pkg-config --cflags --libs ferry) -lpthread
LD_LIBRARY_PATH="$libdir" "$work/ferry_c_test" >/dev/null
contains "$(pkg-config --cflags --libs ferry-client)" "-lferry_client" \
  || fail "pkg-config ferry-client is wrong"

kill -TERM "$daemon_pid"; wait "$daemon_pid"; daemon_pid=
echo "package test: ok"
