#!/usr/bin/env bash
# `pip install ./client/python` into a fresh venv, offline, against Debian's setuptools and
# wheel (--no-build-isolation; the venv sees Debian's site-packages for them and numpy),
# bundling the given build's libferry.so, ferryd and ferryctl. Then, from outside the
# source tree, a Loader with no address starts the bundled ferryd as its private daemon and
# reads an epoch, and the `ferryctl` console command answers. First, a venv that cannot
# build wheels (no `wheel`, an older setuptools: what a pyenv or conda Python gives) is
# refused with a message that says what to install, not "invalid command 'bdist_wheel'".
#   pip_install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(realpath "$1")
build=$(realpath "$2")
work=$(mktemp -d /tmp/ferry-pip-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A copy of the package sources, as a user's checkout would be: the build writes into it.
cp -r "$src/client/python" "$work/python"
rm -rf "$work/python/build" "$work/python/"*.egg-info

# Without Debian's site-packages the venv has ensurepip's setuptools and no wheel.
/usr/bin/python3 -m venv "$work/bare"
if "$work/bare/bin/python" -c 'import wheel' 2>/dev/null ||
   "$work/bare/bin/python" -c 'import setuptools.command.bdist_wheel' 2>/dev/null; then
  echo "pip install test: this venv can build wheels; the missing-wheel case is not checked"
else
  if FERRY_BUILD_DIR="$build" "$work/bare/bin/pip" install --no-build-isolation --no-index \
      --no-deps --disable-pip-version-check "$work/python" >"$work/bare.log" 2>&1; then
    echo "pip install without wheel succeeded; expected the missing-wheel error"; exit 1
  fi
  grep -q "cannot build wheels" "$work/bare.log" && grep -q "pip install wheel" "$work/bare.log" ||
    { echo "pip install without wheel did not say what to install:"; cat "$work/bare.log"; exit 1; }
  rm -rf "$work/python/build" "$work/python/"*.egg-info
fi

/usr/bin/python3 -m venv --system-site-packages "$work/venv"
FERRY_BUILD_DIR="$build" "$work/venv/bin/pip" install --no-build-isolation --no-index \
  --disable-pip-version-check --quiet "$work/python"

site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for f in ferry/__init__.py ferry/_lib/libferry.so ferry/_bin/ferryd ferry/_bin/ferryctl; do
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

# The console command runs the bundled ferryctl, also with no ferry on PATH.
help=$(env PATH=/usr/bin:/bin "$work/venv/bin/ferryctl" --help)
grep -q "usage: ferryctl" <<<"$help" ||
  { echo "the venv's ferryctl did not run the bundled binary"; exit 1; }

# Uninstalling takes everything it installed.
"$work/venv/bin/pip" uninstall --yes --quiet ferry
[[ ! -e $site/ferry ]] || { echo "pip uninstall left $site/ferry"; exit 1; }
echo "pip install test: ok"
