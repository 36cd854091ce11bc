"""Build hooks for the ferry Python package (metadata is in pyproject.toml).

The package is pure Python over libferry.so's C ABI. When a ferry build is found, the wheel
also carries that build's libferry.so (ferry/_lib/) and ferryd (ferry/_bin/), so that
`pip install ./client/python` after building ferry gives a working package with no system
install; the wheel is then tagged for this platform. The build searched:
  1. $FERRY_BUILD_DIR (an error if it lacks libferry.so),
  2. <repo>/build (the Quick start's build directory), when it holds a libferry.so.
With neither, the package loads libferry.so.1 from the system and finds ferryd on PATH
(Debian packages libferry1 and ferryd, or `cmake --install`).
"""

import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _find_build():
    """(libferry.so, ferryd or None) of the ferry build to bundle, or None."""
    explicit = os.environ.get("FERRY_BUILD_DIR")
    candidates = [explicit] if explicit else [os.path.join(HERE, "..", "..", "build")]
    for build in candidates:
        lib = os.path.join(build, "client", "c", "libferry.so")
        daemon = os.path.join(build, "server", "ferryd")
        if os.path.isfile(lib):
            return os.path.realpath(lib), (daemon if os.access(daemon, os.X_OK) else None)
        if explicit:
            raise SystemExit("FERRY_BUILD_DIR=%s has no client/c/libferry.so: build ferry "
                             "there first (cmake --build %s)" % (explicit, explicit))
    return None


BUNDLE = _find_build()


def _copy_stripped(src, dst):
    """Copies a binary without its debug info (a RelWithDebInfo ferryd is mostly DWARF)."""
    shutil.copy2(src, dst)
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, "--strip-debug", dst], check=False)


class BuildPyBundling(build_py):
    def run(self):
        super().run()
        package = os.path.join(self.build_lib, "ferry")
        if BUNDLE is None:
            print("ferry: no ferry build found ($FERRY_BUILD_DIR, <repo>/build); the package "
                  "will use the system's libferry.so.1 and ferryd")
            return
        lib, daemon = BUNDLE
        os.makedirs(os.path.join(package, "_lib"), exist_ok=True)
        _copy_stripped(lib, os.path.join(package, "_lib", "libferry.so"))
        print("ferry: bundling %s" % lib)
        if daemon:
            os.makedirs(os.path.join(package, "_bin"), exist_ok=True)
            _copy_stripped(daemon, os.path.join(package, "_bin", "ferryd"))
            print("ferry: bundling %s" % daemon)


class PlatformDistribution(Distribution):
    """A wheel with bundled binaries is for this platform only."""

    def has_ext_modules(self):
        return BUNDLE is not None


setup(cmdclass={"build_py": BuildPyBundling}, distclass=PlatformDistribution)
