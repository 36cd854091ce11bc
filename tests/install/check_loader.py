"""Reads one epoch through an installed ferry package and checks it; used by the install
tests (pip_install_test.sh, package_test.sh).

    python3 check_loader.py --expect-under DIR [--address SOCKET] [--daemon-under DIR]

Checks that `ferry`, the libferry.so it loaded and (for a private daemon) the ferryd it
started all come from under the given directories, not from a build tree, then reads an
epoch of 1000 int64 records in batches of 16 and checks every record arrives once.
"""

import argparse
import os
import sys
import tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect-under", required=True)
    ap.add_argument("--address")
    ap.add_argument("--daemon-under")
    args = ap.parse_args()

    import ferry
    from ferry import _daemon, _lib

    def under(path, root):
        return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)

    problems = []
    if not under(ferry.__file__, args.expect_under):
        problems.append("ferry imported from %s" % ferry.__file__)
    lib = _lib.path()
    resolved = lib
    if not os.path.isabs(lib):  # a soname the dynamic linker resolved: ask it where
        with open("/proc/self/maps") as maps:
            hits = [line.split()[-1] for line in maps if "libferry.so" in line]
        resolved = hits[0] if hits else lib
    if not under(resolved, args.expect_under):
        problems.append("libferry loaded from %s" % resolved)
    if args.daemon_under:
        daemon = _daemon.find_binary()
        if not under(daemon, args.daemon_under):
            problems.append("ferryd found at %s" % daemon)
    print("ferry %s from %s; libferry from %s" % (ferry.__version__, ferry.__file__, resolved))
    if problems:
        sys.exit("not the installed package: " + "; ".join(problems))

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "records.bin")
        np.arange(1000, dtype=np.int64).tofile(path)
        loader = ferry.Loader(ferry.Records(path, "int64"), batch_size=16, shuffle=True,
                              seed=3, address=args.address, as_numpy=True, timeout=60)
        seen = []
        for batch in loader:
            seen.extend(int(v) for v in batch["data"])
        loader.close()
    if sorted(seen) != list(range(1000)):
        sys.exit("epoch wrong: %d records, %d distinct" % (len(seen), len(set(seen))))
    print("read 1000 records in %d batches" % ((1000 + 15) // 16))


if __name__ == "__main__":
    main()
