"""Console commands of the ferry wheel (pyproject.toml's [project.scripts]).

`ferryctl` runs the ferryctl binary the wheel bundles (ferry/_bin/ferryctl, from the ferry
build it was made with), else the system's (Debian package ferryd) found on PATH, with
the same arguments, environment and exit status.
"""

import os
import shutil
import sys


def _system_ferryctl():
    """The first ferryctl on PATH that is not this console script itself."""
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("ferryctl", path=directory or ".")
        if candidate and os.path.realpath(candidate) != me:
            return candidate
    return None


def ferryctl():
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "ferryctl")
    program = bundled if os.access(bundled, os.X_OK) else _system_ferryctl()
    if program is None:
        sys.exit("ferryctl: this ferry package bundles none (it was built without a ferry "
                 "build: set FERRY_BUILD_DIR when running pip) and none is on PATH "
                 "(Debian package ferryd installs /usr/bin/ferryctl)")
    os.execv(program, [program] + sys.argv[1:])
