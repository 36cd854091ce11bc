"""Build hooks for the ferry Python package (metadata is in pyproject.toml).

The package is pure Python over libferry.so's C ABI. When a ferry build is found, the wheel
also carries that build's libferry.so (ferry/_lib/), ferryd and ferryctl (ferry/_bin/; the
`ferryctl` console command runs the bundled one), so that
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
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _find_build():
    """(libferry.so, [ferryd and ferryctl, those built]) of the ferry build to bundle, or
    None."""
    explicit = os.environ.get("FERRY_BUILD_DIR")
    candidates = [explicit] if explicit else [os.path.join(HERE, "..", "..", "build")]
    for build in candidates:
        lib = os.path.join(build, "client", "c", "libferry.so")
        programs = [os.path.join(build, "server", "ferryd"),
                    os.path.join(build, "client", "ferryctl", "ferryctl")]
        if os.path.isfile(lib):
            return os.path.realpath(lib), [p for p in programs if os.access(p, os.X_OK)]
        if explicit:
            raise SystemExit("FERRY_BUILD_DIR=%s has no client/c/libferry.so: build ferry "
                             "there first (cmake --build %s)" % (explicit, explicit))
    return None


def _check_wheel_support():
    """pip's --no-build-isolation builds with this Python's own setuptools; before setuptools
    70.1 its bdist_wheel command comes from the separate `wheel` package, and without it
    pip fails with "invalid command 'bdist_wheel'". Say what to install instead."""
    # pip runs dist_info (its metadata step, which needs bdist_wheel too), then bdist_wheel.
    if "bdist_wheel" not in sys.argv and "dist_info" not in sys.argv:
        return
    try:
        import wheel  # noqa: F401
        return
    except ImportError:
        pass
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools 70.1 and later)
        return
    except ImportError:
        pass
    raise SystemExit(
        "ferry: this Python (%s) cannot build wheels: its setuptools has no bdist_wheel and "
        "the 'wheel' package is not installed. Online: leave out --no-build-isolation (pip "
        "then fetches setuptools and wheel itself), or run `%s -m pip install wheel` first. "
        "Offline on Debian: make the venv from Debian's Python with Debian's packages, "
        "`sudo apt install python3-wheel python3-setuptools` then `/usr/bin/python3 -m venv "
        "--system-site-packages VENV` (docs/install.md)" % (sys.executable, sys.executable))


_check_wheel_support()
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
        lib, programs = BUNDLE
        os.makedirs(os.path.join(package, "_lib"), exist_ok=True)
        _copy_stripped(lib, os.path.join(package, "_lib", "libferry.so"))
        print("ferry: bundling %s" % lib)
        for program in programs:
            os.makedirs(os.path.join(package, "_bin"), exist_ok=True)
            _copy_stripped(program, os.path.join(package, "_bin", os.path.basename(program)))
            print("ferry: bundling %s" % program)


class PlatformDistribution(Distribution):
    """A wheel with bundled binaries is for this platform only."""

    def has_ext_modules(self):
        return BUNDLE is not None


setup(cmdclass={"build_py": BuildPyBundling}, distclass=PlatformDistribution)
