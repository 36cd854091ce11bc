"""ctypes binding of libferry.so (the C ABI in client/c/include/ferry/ferry.h).

The library is found, in order, at:
  1. $FERRY_LIBRARY (a file path; an error if it does not exist),
  2. next to this package: ferry/_lib/libferry.so (how the build tree and installs ship it),
  3. a build tree of the source checkout this package sits in: <repo>/build*/client/c/,
  4. the dynamic linker's search path (libferry.so.1, as installed to the system libdir).
It is loaded on first use, so `import ferry` and argument checking work without it.
"""

import ctypes
import ctypes.util
import glob
import os
import threading

from ferry.errors import FerryError

ABI_VERSION = 1  # FERRY_ABI_VERSION this binding was written for
ABI_MINOR = 9    # the newest FERRY_ABI_MINOR it uses where the library has it (1.1: GPU
                 # transport, 1.2: quarantine, 1.3: attach_on, 1.4: job limits and error
                 # reasons, 1.5: resuming on another world size, 1.6: bool fields,
                 # 1.7: ferry_client_set_held_rank_wait, 1.8: taking a job back on a
                 # restarted ferryd, 1.9: resume points)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# ferry_reconnect_fn: int (*)(void* ctx, char* error, size_t error_size).
RECONNECT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class Field(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
        ("device", ctypes.c_int),  # ABI 1.1
    ]


class BatchInfo(ctypes.Structure):
    _fields_ = [
        ("epoch", ctypes.c_int64),
        ("index", ctypes.c_int64),
        ("seq", ctypes.c_int64),
        ("slot", ctypes.c_uint32),
        ("num_samples", ctypes.c_uint32),
        ("num_fields", ctypes.c_uint32),
    ]


def candidates(environ=None, package_dir=_PACKAGE_DIR):
    """Places to look for libferry.so, best first, as (path or soname, how it was found)."""
    environ = os.environ if environ is None else environ
    out = []
    if environ.get("FERRY_LIBRARY"):
        return [(environ["FERRY_LIBRARY"], "$FERRY_LIBRARY")]
    out.append((os.path.join(package_dir, "_lib", "libferry.so"), "package"))
    # <repo>/client/python/ferry -> <repo>/build*/client/c/libferry.so, newest first.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(package_dir)))
    built = glob.glob(os.path.join(repo, "build*", "client", "c", "libferry.so"))
    built.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    out.extend((p, "build tree") for p in built)
    out.append(("libferry.so.%d" % ABI_VERSION, "dynamic linker"))
    return out


class Range(ctypes.Structure):
    """ferry_range_t: positions [begin, end) of an epoch's order."""
    _fields_ = [("begin", ctypes.c_int64), ("end", ctypes.c_int64)]


class EpochInfo(ctypes.Structure):
    """ferry_epoch_info_t (ABI 1.5)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("positions", ctypes.c_int64),
                ("world_size", ctypes.c_int64), ("batch_size", ctypes.c_int64),
                ("drop_last", ctypes.c_int), ("contiguous_ranks", ctypes.c_int),
                ("consumed", ctypes.POINTER(Range)), ("num_consumed", ctypes.c_size_t)]


class ResumePoint(ctypes.Structure):
    """ferry_resume_point_t (ABI 1.9)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("epoch", ctypes.c_int64),
                ("positions", ctypes.c_int64), ("consumed", ctypes.POINTER(Range)),
                ("num_consumed", ctypes.c_size_t), ("consumed_capacity", ctypes.c_size_t),
                ("world_size", ctypes.c_int64), ("batch_size", ctypes.c_int64),
                ("drop_last", ctypes.c_int), ("resumed_from", ctypes.POINTER(Range)),
                ("num_resumed_from", ctypes.c_size_t),
                ("resumed_from_capacity", ctypes.c_size_t), ("batches_done", ctypes.c_int64)]


def ranges(pairs):
    """A ctypes array of Range from [[begin, end], ...]."""
    pairs = list(pairs)
    return (Range * max(1, len(pairs)))(*[Range(int(b), int(e)) for b, e in pairs])


def require_resume_abi():
    """Raises unless the loaded libferry resumes on another world size (ABI 1.5)."""
    if not hasattr(load(), "ferry_epoch_consumed"):
        raise FerryError("FAILED_PRECONDITION", "the loaded libferry (ABI minor %d) predates "
                         "elastic resume (1.5): install libferry from this ferry's package"
                         % minor())


def resume_point(point):
    """A ResumePoint (and the arrays it points into) from a dict with the keys of
    ferry_resume_point_t: epoch, positions, consumed, world_size, batch_size, drop_last,
    resumed_from, batches_done (ranges as [[begin, end], ...])."""
    consumed, resumed = list(point["consumed"]), list(point["resumed_from"])
    arrays = (ranges(consumed), ranges(resumed))
    c = ResumePoint(ctypes.sizeof(ResumePoint), int(point["epoch"]), int(point["positions"]),
                    arrays[0], len(consumed), len(consumed), int(point["world_size"]),
                    int(point["batch_size"]), int(bool(point["drop_last"])), arrays[1],
                    len(resumed), len(resumed), int(point["batches_done"]))
    return c, arrays


def resume_plan(point, info):
    """ferry_resume_plan: (epoch, dealt_after ranges, first_batch) where a run dealt as `info`
    (epoch_info's dict) starts from `point` (resume_point's dict). Needs no daemon."""
    lib = load()
    if not hasattr(lib, "ferry_resume_plan"):
        raise FerryError("FAILED_PRECONDITION", "the loaded libferry (ABI minor %d) predates "
                         "resume points (1.9): install libferry from this ferry's package"
                         % minor())
    c, _arrays = resume_point(point)
    run = EpochInfo(ctypes.sizeof(EpochInfo), int(info["positions"]), int(info["world_size"]),
                    int(info["batch_size"]), int(bool(info["drop_last"])),
                    int(bool(info["contiguous_ranks"])), None, 0)
    capacity = max(len(point["consumed"]), len(point["resumed_from"]))
    out = (Range * max(1, capacity))()
    epoch, first, count = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_size_t()
    check(lib.ferry_resume_plan(ctypes.byref(c), ctypes.byref(run), ctypes.byref(epoch),
                                ctypes.byref(first), out, capacity, ctypes.byref(count)))
    return epoch.value, [[out[i].begin, out[i].end] for i in range(count.value)], first.value


def epoch_consumed(info, batches_done):
    """ferry_epoch_consumed: the consumed ranges [[begin, end], ...] once every rank of the run
    `info` describes (a dict: positions, world_size, batch_size, drop_last, contiguous_ranks,
    consumed) took its first batches_done batches. Needs no daemon."""
    require_resume_abi()
    lib = load()
    base = list(info.get("consumed", ()))
    arr = ranges(base)
    c = EpochInfo(ctypes.sizeof(EpochInfo), int(info["positions"]), int(info["world_size"]),
                  int(info["batch_size"]), int(bool(info["drop_last"])),
                  int(bool(info["contiguous_ranks"])), arr, len(base))
    capacity = len(base) + int(info["world_size"]) + 1
    out = (Range * capacity)()
    count = ctypes.c_size_t()
    check(lib.ferry_epoch_consumed(ctypes.byref(c), int(batches_done), out, capacity,
                                   ctypes.byref(count)))
    return [[out[i].begin, out[i].end] for i in range(count.value)]


def _declare(lib):
    c_int, c_char_p, c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
    out_ptr = ctypes.POINTER(c_void_p)
    sigs = {
        "ferry_abi_version": (c_int, []),
        "ferry_version": (c_char_p, []),
        "ferry_last_error": (c_char_p, []),
        "ferry_status_name": (c_char_p, [c_int]),
        "ferry_free": (None, [c_void_p]),
        "ferry_default_address": (c_int, [out_ptr]),
        "ferry_client_connect": (c_int, [c_char_p, out_ptr]),
        "ferry_client_free": (None, [c_void_p]),
        "ferry_client_daemon_pid": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
        "ferry_client_create_job": (c_int, [c_void_p, c_char_p, c_char_p, out_ptr]),
        "ferry_client_get_job": (c_int, [c_void_p, c_char_p, out_ptr]),
        "ferry_client_list_jobs": (c_int, [c_void_p, out_ptr]),
        "ferry_client_delete_job": (c_int, [c_void_p, c_char_p]),
        "ferry_client_get_status": (c_int, [c_void_p, out_ptr]),
        "ferry_client_attach": (c_int, [c_void_p, c_char_p, ctypes.c_uint32, out_ptr]),
        "ferry_consumer_free": (None, [c_void_p]),
        "ferry_consumer_batches_per_epoch": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_int64)]),
        "ferry_consumer_start_epoch": (c_int, [c_void_p, ctypes.c_int64, ctypes.c_int64]),
        "ferry_consumer_next": (c_int, [c_void_p, ctypes.c_int64, out_ptr]),
        "ferry_batch_info": (c_int, [c_void_p, ctypes.POINTER(BatchInfo)]),
        "ferry_batch_field": (c_int, [c_void_p, ctypes.c_uint32, ctypes.POINTER(Field)]),
        "ferry_batch_release": (c_int, [c_void_p]),
        "ferry_batch_free": (None, [c_void_p]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    # ABI 1.1 (GPU transport): absent from older libraries; see minor().
    optional = {
        "ferry_abi_minor": (c_int, []),
        "ferry_batch_field_sized": (c_int, [c_void_p, ctypes.c_uint32, ctypes.POINTER(Field),
                                            ctypes.c_size_t]),
        "ferry_batch_wait": (c_int, [c_void_p, c_void_p]),
        "ferry_batch_release_on": (c_int, [c_void_p, c_void_p]),
        "ferry_batch_device": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
        "ferry_cuda_pci_bus_id": (c_int, [c_int, out_ptr]),
        "ferry_client_quarantine": (c_int, [c_void_p, c_char_p, ctypes.POINTER(ctypes.c_int64),
                                            ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32)]),
        "ferry_client_attach_on": (c_int, [c_void_p, c_char_p, ctypes.c_uint32, c_char_p,
                                           out_ptr]),
        "ferry_job_limit": (ctypes.c_uint64, [c_int]),
        "ferry_last_error_reason": (ctypes.c_char_p, []),
        "ferry_consumer_resume_epoch": (c_int, [c_void_p, ctypes.c_int64,
                                                ctypes.POINTER(Range), ctypes.c_size_t,
                                                ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]),
        "ferry_consumer_epoch_batches": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_int64)]),
        "ferry_job_epoch_info": (c_int, [c_void_p, ctypes.POINTER(EpochInfo)]),
        "ferry_epoch_consumed": (c_int, [ctypes.POINTER(EpochInfo), ctypes.c_int64,
                                         ctypes.POINTER(Range), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t)]),
        "ferry_client_set_held_rank_wait": (c_int, [c_void_p, ctypes.c_double]),
        "ferry_client_set_reattach": (c_int, [c_void_p, ctypes.c_double, RECONNECT_FN,
                                              c_void_p]),
        "ferry_consumer_attaches": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_int64)]),
        "ferry_resume_plan": (c_int, [ctypes.POINTER(ResumePoint), ctypes.POINTER(EpochInfo),
                                      ctypes.POINTER(ctypes.c_int64),
                                      ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(Range),
                                      ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "ferry_consumer_position": (c_int, [c_void_p, ctypes.POINTER(ResumePoint)]),
        "ferry_consumer_resume": (c_int, [c_void_p, ctypes.POINTER(ResumePoint),
                                          ctypes.POINTER(ctypes.c_int64),
                                          ctypes.POINTER(ctypes.c_int64)]),
    }
    for name, (restype, argtypes) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes


def minor():
    """FERRY_ABI_MINOR of the loaded library (0 for a library that predates it)."""
    lib = load()
    return lib.ferry_abi_minor() if hasattr(lib, "ferry_abi_minor") else 0


# ferry_job_limit's FERRY_LIMIT_* values (ABI 1.4).
_JOB_LIMITS = {"batch_size": 1, "world_size": 2, "prefetch_depth": 3, "job_name_bytes": 4}


def job_limit(name):
    """ferryd's bound on a job spec's `name` ("batch_size", "world_size", "prefetch_depth",
    "job_name_bytes"), from libferry (ABI 1.4); None from an older library (ferryd checks
    it then)."""
    lib = load()
    if not hasattr(lib, "ferry_job_limit"):
        return None
    return lib.ferry_job_limit(_JOB_LIMITS[name]) or None


def require_gpu_abi():
    """Raises FerryError unless the loaded library has the GPU transport's C ABI (1.1)."""
    if minor() < 1:
        raise FerryError("FAILED_PRECONDITION",
                         "%s has C ABI 1.%d; the GPU transport needs 1.1: install a matching "
                         "libferry.so or point FERRY_LIBRARY at one" % (path(), minor()))


def cuda_pci_bus_id(ordinal):
    """PCI bus id ("0000:3b:00.0") of this process's CUDA device `ordinal`."""
    require_gpu_abi()
    lib = load()
    out = ctypes.c_void_p()
    check(lib.ferry_cuda_pci_bus_id(int(ordinal), ctypes.byref(out)))
    return take_string(out.value)


_lock = threading.Lock()
_lib = None
_path = None


def load():
    """The loaded library (ctypes.CDLL, which releases the GIL during calls)."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path, how in candidates():
            if how != "dynamic linker" and not os.path.exists(path):
                tried.append("%s (%s): not found" % (path, how))
                if how == "$FERRY_LIBRARY":
                    break
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s): %s" % (path, how, e))
                if how == "$FERRY_LIBRARY":
                    break
                continue
            version = lib.ferry_abi_version()
            if version != ABI_VERSION:
                raise FerryError(
                    "FAILED_PRECONDITION",
                    "%s has C ABI version %d, this ferry package needs %d; install matching "
                    "versions or point FERRY_LIBRARY at the right libferry.so"
                    % (path, version, ABI_VERSION))
            _declare(lib)
            _lib, _path = lib, path
            return lib
        raise FerryError(
            "NOT_FOUND",
            "cannot load libferry.so; tried: " + "; ".join(tried) +
            ". Build it (cmake --build <build> --target ferry_c) or set FERRY_LIBRARY")


def path():
    """Where the loaded library came from (loads it if needed)."""
    load()
    return _path


# Status code names and values (absl/gRPC), for errors raised in Python that go back to C.
STATUS_CODES = {
    "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}


def check(code):
    """Raises FerryError for a non-zero status code from the C layer."""
    if code != 0:
        lib = load()
        reason = (lib.ferry_last_error_reason() or b"").decode() if hasattr(
            lib, "ferry_last_error_reason") else ""
        raise FerryError(lib.ferry_status_name(code).decode(),
                         lib.ferry_last_error().decode(errors="replace"), code, reason)


def take_string(ptr):
    """Copies a char* returned by the library into a str and frees it."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        load().ferry_free(ptr)
