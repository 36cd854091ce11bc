"""What the package's tests share: whether a ferryd binary is there to run end-to-end tests
against (FERRY_DAEMON or the build tree), the repository's testing/ modules on sys.path
(testing/megatron_indexed.py, testing/blend_reference.py), and a Loader opened for a test."""

import os
import sys

import ferry
from ferry import _daemon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "testing"))

try:
    _daemon.find_binary()
    HAVE_FERRYD = True
except ferry.FerryError:
    HAVE_FERRYD = False


def open_loader(test, dataset, batch_size, **kwargs):
    """A ferry.Loader of numpy batches (prefetch 2, 30 s timeout unless kwargs say
    otherwise), closed when `test` (a unittest.TestCase) ends."""
    args = dict(dataset=dataset, batch_size=batch_size, prefetch=2, as_numpy=True, timeout=30)
    args.update(kwargs)
    loader = ferry.Loader(**args)
    test.addCleanup(loader.close)
    return loader
