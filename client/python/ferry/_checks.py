"""Argument checks shared by the Loader, its datasets and transforms: each names the
argument and says what it takes."""

import numbers
import os

from ferry.errors import FerryError


def _check_int(name, value, minimum=None, maximum=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an int, got %r" % (name, value))
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError("%s must be >= %d, got %d" % (name, minimum, value))
    if maximum is not None and value > maximum:
        raise ValueError("%s must be <= %d, got %d" % (name, maximum, value))
    return value


def _job_limit(name):
    """ferryd's bound on the JobSpec field `name`, as libferry exports it (so that the Loader
    refuses what ferryd would, with the same number); the field's uint32 range where the
    library is older or absent (ferryd checks the bound then)."""
    from ferry import _lib
    try:
        return _lib.job_limit(name) or 2**32 - 1
    except (FerryError, OSError):
        return 2**32 - 1


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError("%s must be a bool, got %r" % (name, value))
    return value


_REMOTE_SCHEMES = ("s3://", "http://", "https://")


def _is_remote(path):
    """Whether a dataset path names an object in a store ("s3://bucket/key") or on an HTTP(S)
    server, which ferryd fetches into its node cache (docs/operations.md, "Remote
    datasets")."""
    return isinstance(path, str) and path.startswith(_REMOTE_SCHEMES)


def _check_path(name, value):
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError("%s must be a path (str or os.PathLike), got %r" % (name, value))
    value = os.fspath(value)
    if not value:
        raise ValueError("%s must not be empty" % name)
    if _is_remote(value):
        return value
    return os.path.abspath(value)  # ferryd resolves paths itself: it needs absolute ones


def _check_range(name, value):
    if (not isinstance(value, (tuple, list)) or len(value) != 2 or
            not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)):
        raise TypeError("%s must be a pair of numbers, got %r" % (name, value))
    lo, hi = float(value[0]), float(value[1])
    if not 0 < lo <= hi:
        raise ValueError("%s must satisfy 0 < min <= max, got %r" % (name, value))
    return lo, hi


def _check_path_like(name, value):
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError("%s must be a socket path (str or os.PathLike), got %r" % (name, value))
    return value
