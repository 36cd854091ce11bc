#!/usr/bin/env bash
# `pip install ./client/python` into a fresh venv, offline, against Debian's setuptools and
# wheel (--no-build-isolation; the venv sees Debian's site-packages for them and numpy),
# bundling the given build's libferry.so and ferryd. Then, from outside the source tree, a
# Loader with no address starts the bundled ferryd as its private daemon and reads an epoch.
#   pip_install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(realpath "$1")
build=$(realpath "$2")
work=$(mktemp -d /tmp/ferry-pip-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 -m venv --system-site-packages "$work/venv"
# A copy of the package sources, as a user's checkout would be: the build writes into it.
cp -r "$src/client/python" "$work/python"
rm -rf "$work/python/build" "$work/python/"*.egg-info
FERRY_BUILD_DIR="$build" "$work/venv/bin/pip" install --no-build-isolation --no-index \
  --disable-pip-version-check --quiet "$work/python"

site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for f in ferry/__init__.py ferry/_lib/libferry.so ferry/_bin/ferryd; do
  [[ -e $site/$f ]] || { echo "pip install left out $f (looked in $site)"; exit 1; }
done
version=$("$work/venv/bin/pip" show ferry | sed -n "s/^Version: //p")
[[ $version == 0.1.0 ]] || { echo "pip show ferry: version $version, expected 0.1.0"; exit 1; }

# Outside the source tree, with no ferry on PATH and no daemon at the default address.
cd "$work"
env -u PYTHONPATH -u FERRY_DAEMON -u FERRY_LIBRARY -u FERRY_ADDRESS \
  PATH=/usr/bin:/bin XDG_RUNTIME_DIR="$work/run" XDG_CACHE_HOME="$work/cache" \
  FERRY_DAEMON_IDLE_SECONDS=2 \
  "$work/venv/bin/python" "$src/tests/install/check_loader.py" \
  --expect-under "$site" --daemon-under "$site"

# Uninstalling takes everything it installed.
"$work/venv/bin/pip" uninstall --yes --quiet ferry
[[ ! -e $site/ferry ]] || { echo "pip uninstall left $site/ferry"; exit 1; }
echo "pip install test: ok"
