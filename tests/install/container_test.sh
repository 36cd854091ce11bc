#!/usr/bin/env bash
# The Dockerfile: builds the image (host transport, WITH_CUDA=0) with a Docker engine or
# podman, starts it, checks that the packaged ferryd answers `ferryctl status` inside the
# container as the system daemon (config /etc/ferry/ferryd.conf, user ferry), and that
# SIGTERM (docker stop) ends it with status 0. Exits 77 (CTest: skipped), saying why, where
# neither a Docker engine nor podman runs.
#   container_test.sh SOURCE_DIR
set -euo pipefail
src=$(realpath "$1")
engine=
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  engine=docker
elif command -v podman >/dev/null && podman info >/dev/null 2>&1; then
  engine=podman
fi
if [[ -z $engine ]]; then
  echo "container test skipped: no Docker engine answers (docker info) and no podman;" \
    "install docker.io or podman to run it"
  exit 77
fi
tag=ferry-container-test:$$
name=ferry-container-test-$$
cleanup() {
  "$engine" rm -f "$name" >/dev/null 2>&1 || true
  "$engine" rmi -f "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT
fail() { echo "container test: $*" >&2; "$engine" logs "$name" 2>&1 | tail -n 20 >&2 || true; exit 1; }

"$engine" build --build-arg WITH_CUDA=0 -t "$tag" "$src" >/tmp/ferry-container-build.$$.log 2>&1 \
  || { tail -n 40 /tmp/ferry-container-build.$$.log; fail "image build failed"; }
rm -f /tmp/ferry-container-build.$$.log
"$engine" run -d --name "$name" "$tag" >/dev/null
status=
for _ in $(seq 100); do
  if status=$("$engine" exec "$name" ferryctl --address /run/ferry/ferryd.sock status 2>&1); then
    break
  fi
  status=
  sleep 0.2
done
[[ -n $status ]] || fail "ferryd in the container did not answer within 20 s"
grep -qF "/etc/ferry/ferryd.conf" <<<"$status" || fail "ferryd did not read the packaged config: $status"
uid=$("$engine" exec "$name" sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' /proc/1/status)
[[ $uid == 7070 ]] || fail "ferryd runs as uid '$uid', expected 7070 (user ferry)"
"$engine" stop -t 20 "$name" >/dev/null
code=$("$engine" wait "$name" 2>/dev/null || "$engine" inspect -f '{{.State.ExitCode}}' "$name")
[[ $code == 0 ]] || fail "ferryd exited with $code on SIGTERM"
echo "container test: ok ($engine)"
