"""Low-level Python wrappers of the C ABI: Client, Consumer and Batch.

Most users want ferry.Loader; these are for tools and tests. JSON answers are decoded with
the json module (proto3 JSON mapping with proto field names: 64-bit integers arrive as
strings).
"""

import ctypes
import json

import numpy as np

from ferry import _lib
from ferry.errors import FerryError

# FERRY_DTYPE_* -> numpy dtype. bfloat16 has no numpy type: its raw bits come as uint16.
NUMPY_DTYPES = {
    1: np.dtype(np.uint8),
    2: np.dtype("<u2"),
    3: np.dtype("<u4"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f2"),
    7: np.dtype("<u2"),
    8: np.dtype("<f4"),
    9: np.dtype(np.bool_),
}
DTYPE_NAMES = {1: "uint8", 2: "uint16", 3: "uint32", 4: "int32", 5: "int64", 6: "float16",
               7: "bfloat16", 8: "float32", 9: "bool"}


def default_address():
    """The socket a plain ferry.Client() connects to."""
    lib = _lib.load()
    out = ctypes.c_void_p()
    _lib.check(lib.ferry_default_address(ctypes.byref(out)))
    return _lib.take_string(out.value)


def _encode(s):
    return None if s is None else str(s).encode()


class Client:
    """A session with one ferryd. Thread-safe. Close it (or use `with`) when done."""

    def __init__(self, address=None):
        lib = _lib.load()
        handle = ctypes.c_void_p()
        _lib.check(lib.ferry_client_connect(_encode(address or ""), ctypes.byref(handle)))
        self._lib = lib
        self._handle = handle

    def _h(self):
        if not self._handle:
            raise FerryError("FAILED_PRECONDITION", "the ferry.Client is closed")
        return self._handle

    def _json(self, fn, *args):
        out = ctypes.c_void_p()
        _lib.check(fn(self._h(), *args, ctypes.byref(out)))
        return json.loads(_lib.take_string(out.value))

    @property
    def daemon_pid(self):
        pid = ctypes.c_int()
        _lib.check(self._lib.ferry_client_daemon_pid(self._h(), ctypes.byref(pid)))
        return pid.value

    def create_job(self, spec, name=None):
        """Creates (or finds) a job; `spec` is a ferry.v1.JobSpec as a dict. Returns the Job."""
        return self._json(self._lib.ferry_client_create_job, _encode(name or ""),
                          json.dumps(spec).encode())

    def get_job(self, job_id):
        return self._json(self._lib.ferry_client_get_job, _encode(job_id))

    def list_jobs(self):
        return self._json(self._lib.ferry_client_list_jobs).get("jobs", [])

    def delete_job(self, job_id):
        _lib.check(self._lib.ferry_client_delete_job(self._h(), _encode(job_id)))

    def status(self):
        return self._json(self._lib.ferry_client_get_status)

    def quarantine(self, job_id, indices):
        """Quarantines samples known to be bad (from a resume state taken on an earlier
        ferryd); returns how many were new."""
        fn = getattr(self._lib, "ferry_client_quarantine", None)
        if fn is None:
            raise FerryError("UNIMPLEMENTED", "%s predates ferry_client_quarantine (C ABI "
                             "1.2); install a libferry.so matching this ferry package"
                             % _lib.path())
        indices = [int(i) for i in indices]
        array = (ctypes.c_int64 * len(indices))(*indices)
        added = ctypes.c_uint32()
        _lib.check(fn(self._h(), _encode(job_id), array, len(indices), ctypes.byref(added)))
        return added.value

    def set_held_rank_wait(self, seconds):
        """How long attach() waits for a rank another consumer holds (reason "RANK_HELD") to
        be let go before raising that refusal, which names the holder's pid: a consumer
        closed just before ends its stream asynchronously. 0 refuses at once. Default: 5 s.
        A libferry older than ABI 1.7 keeps its own wait."""
        fn = getattr(self._lib, "ferry_client_set_held_rank_wait", None)
        if fn is not None:
            _lib.check(fn(self._h(), float(seconds)))

    def set_reattach(self, seconds, before_reconnect=None):
        """Consumers of jobs this client created take their job back on the ferryd that
        answers at this client's address when theirs goes away (a restart, an upgrade),
        trying for up to `seconds`, and go on with the epoch where it was; job ids this
        client returned keep naming their jobs. `before_reconnect()`, if given, runs before
        each attempt to connect again; a FerryError it raises ends that attempt (others are
        UNKNOWN errors). 0 (the default): fail with UNAVAILABLE at once. Needs libferry ABI
        1.8."""
        fn = getattr(self._lib, "ferry_client_set_reattach", None)
        if fn is None:
            raise FerryError("FAILED_PRECONDITION", "%s predates ferry_client_set_reattach "
                             "(C ABI 1.8); install the libferry.so of this ferry package"
                             % _lib.path())
        hook = None
        if before_reconnect is not None:
            def hook(ctx, error, error_size):
                try:
                    before_reconnect()
                    return 0
                except BaseException as e:  # never unwind into C
                    code = _lib.STATUS_CODES.get(getattr(e, "code", ""), 2)
                    text = (getattr(e, "message", None) or str(e)).encode(errors="replace")
                    text = text[:max(0, error_size - 1)] + b"\0"
                    ctypes.memmove(error, text, len(text))
                    return code
            hook = _lib.RECONNECT_FN(hook)
        _lib.check(fn(self._h(), float(seconds), hook or _lib.RECONNECT_FN(), None))
        self._reconnect_hook = hook  # the C side calls it for as long as this client lives

    def attach(self, job_id, rank, device=None):
        """Attaches as `rank` of the job; `device` names a GPU rank's GPU ("cuda:<PCI bus id>"
        or "cuda:N", ferryd's ordinal), required for a job of device "cuda"."""
        handle = ctypes.c_void_p()
        if device:
            fn = getattr(self._lib, "ferry_client_attach_on", None)
            if fn is None:
                raise FerryError("FAILED_PRECONDITION", "this libferry (ABI 1.%d) cannot name a "
                                 "rank's GPU (ferry_client_attach_on, 1.3): install the "
                                 "libferry of this ferry package" % _lib.minor())
            _lib.check(fn(self._h(), _encode(job_id), int(rank), _encode(device),
                          ctypes.byref(handle)))
        else:
            _lib.check(self._lib.ferry_client_attach(self._h(), _encode(job_id), int(rank),
                                                     ctypes.byref(handle)))
        return Consumer(self._lib, handle)

    def close(self):
        if self._handle:
            self._lib.ferry_client_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


class Consumer:
    """One rank of one job. Use from one thread at a time."""

    def __init__(self, lib, handle):
        self._lib = lib
        self._handle = handle

    def _h(self):
        if not self._handle:
            raise FerryError("FAILED_PRECONDITION", "the ferry consumer is closed")
        return self._handle

    @property
    def batches_per_epoch(self):
        n = ctypes.c_int64()
        _lib.check(self._lib.ferry_consumer_batches_per_epoch(self._h(), ctypes.byref(n)))
        return n.value

    @property
    def attaches(self):
        """How many times this consumer attached (1, then one more at every reattach);
        views of slots taken before a reattach must be taken again. 1 with a libferry
        older than ABI 1.8."""
        fn = getattr(self._lib, "ferry_consumer_attaches", None)
        if fn is None:
            return 1
        n = ctypes.c_int64()
        _lib.check(fn(self._h(), ctypes.byref(n)))
        return n.value

    def start_epoch(self, epoch, first_batch=0):
        _lib.check(self._lib.ferry_consumer_start_epoch(self._h(), int(epoch), int(first_batch)))

    def resume_epoch(self, epoch, consumed, first_batch=0):
        """The rest of `epoch` after a run consumed the positions `consumed` ([[begin, end],
        ...], sorted and disjoint; see ferry_consumer_resume_epoch): starts it at
        first_batch and returns its batches per rank."""
        _lib.require_resume_abi()
        consumed = list(consumed)
        batches = ctypes.c_int64()
        _lib.check(self._lib.ferry_consumer_resume_epoch(
            self._h(), int(epoch), _lib.ranges(consumed), len(consumed), int(first_batch),
            ctypes.byref(batches)))
        return batches.value

    def position(self):
        """Where the run stands after the last batch next() returned, as a dict (epoch,
        positions, consumed, world_size, batch_size, drop_last, resumed_from,
        batches_done; ranges as [[begin, end], ...]): what a checkpoint keeps, for resume()
        on any world size and batch size. Needs libferry ABI 1.9; no daemon."""
        fn = getattr(self._lib, "ferry_consumer_position", None)
        if fn is None:
            raise FerryError("FAILED_PRECONDITION", "%s predates ferry_consumer_position (C "
                             "ABI 1.9); install the libferry.so of this ferry package"
                             % _lib.path())
        capacity = 8
        while True:
            consumed, resumed = (_lib.Range * capacity)(), (_lib.Range * capacity)()
            point = _lib.ResumePoint(ctypes.sizeof(_lib.ResumePoint))
            point.consumed, point.consumed_capacity = consumed, capacity
            point.resumed_from, point.resumed_from_capacity = resumed, capacity
            code = fn(self._h(), ctypes.byref(point))
            needed = max(point.num_consumed, point.num_resumed_from)
            if code == _lib.STATUS_CODES["RESOURCE_EXHAUSTED"] and needed > capacity:
                capacity = needed
                continue
            _lib.check(code)
            return {"epoch": point.epoch, "positions": point.positions,
                    "consumed": [[consumed[i].begin, consumed[i].end]
                                 for i in range(point.num_consumed)],
                    "world_size": point.world_size, "batch_size": point.batch_size,
                    "drop_last": bool(point.drop_last),
                    "resumed_from": [[resumed[i].begin, resumed[i].end]
                                     for i in range(point.num_resumed_from)],
                    "batches_done": point.batches_done}

    def resume(self, point):
        """Starts where `point` (position() of any run of a job over the same data and
        order) says: the next epoch after one consumed whole, the same deal at its batch on
        a run dealt alike, else the rest of the epoch dealt to this run. Returns (epoch,
        first_batch). Needs libferry ABI 1.9."""
        fn = getattr(self._lib, "ferry_consumer_resume", None)
        if fn is None:
            raise FerryError("FAILED_PRECONDITION", "%s predates ferry_consumer_resume (C ABI "
                             "1.9); install the libferry.so of this ferry package"
                             % _lib.path())
        c, _arrays = _lib.resume_point(point)
        epoch, first = ctypes.c_int64(), ctypes.c_int64()
        _lib.check(fn(self._h(), ctypes.byref(c), ctypes.byref(epoch), ctypes.byref(first)))
        return epoch.value, first.value

    def epoch_info(self):
        """How the job deals an epoch, for _lib.epoch_consumed: positions, world_size,
        batch_size, drop_last, contiguous_ranks (and consumed: none)."""
        _lib.require_resume_abi()
        info = _lib.EpochInfo()
        info.struct_size = ctypes.sizeof(_lib.EpochInfo)
        _lib.check(self._lib.ferry_job_epoch_info(self._h(), ctypes.byref(info)))
        return {"positions": info.positions, "world_size": info.world_size,
                "batch_size": info.batch_size, "drop_last": bool(info.drop_last),
                "contiguous_ranks": bool(info.contiguous_ranks), "consumed": []}

    def next(self, timeout_ms=-1):
        """The next Batch, or None at the end of the epoch. FerryError DEADLINE_EXCEEDED when
        nothing arrived within timeout_ms (nothing is lost; call again)."""
        out = ctypes.c_void_p()
        _lib.check(self._lib.ferry_consumer_next(self._h(), int(timeout_ms), ctypes.byref(out)))
        if not out.value:
            return None
        return Batch(self._lib, out)

    def close(self):
        if self._handle:
            self._lib.ferry_consumer_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


class _ArrayView:
    """Exposes one field's memory through __array_interface__ and keeps its Batch alive, so
    the mapping outlives every numpy array that views it."""

    def __init__(self, data, shape, dtype, owner):
        self.__array_interface__ = {
            "data": (data, True),  # read-only: the slab is mapped PROT_READ
            "shape": tuple(shape),
            "typestr": dtype.str,
            "version": 3,
        }
        self._owner = owner


# FERRY_DTYPE_* -> (__cuda_array_interface__ typestr, torch dtype name). bfloat16 has no
# typestr: it travels as int16 and is reinterpreted.
_TORCH_VIEWS = {
    1: ("|u1", "uint8"),
    2: ("<u2", "uint16"),  # torch >= 2.3
    3: ("<u4", "uint32"),  # torch >= 2.3
    4: ("<i4", "int32"),
    5: ("<i8", "int64"),
    6: ("<f2", "float16"),
    7: ("<i2", "bfloat16"),
    8: ("<f4", "float32"),
    9: ("|b1", "bool"),
}


class _CudaView:
    """One GPU field through __cuda_array_interface__ (v3); keeps its Batch alive, so the
    IPC mapping outlives every tensor that views it. No "stream": ordering is the caller's
    job, through Batch.wait()."""

    def __init__(self, data, shape, typestr, owner):
        self.__cuda_array_interface__ = {
            "data": (data, False),
            "shape": tuple(shape),
            "typestr": typestr,
            "strides": None,
            "stream": None,
            "version": 3,
        }
        self._owner = owner


class Batch:
    """One batch in shared memory plus a lease on its slot.

    `arrays()` returns read-only numpy views of the shared memory; they stay readable as
    long as they live, but after release() the daemon may overwrite their contents.
    """

    def __init__(self, lib, handle):
        self._lib = lib
        self._handle = handle
        info = _lib.BatchInfo()
        _lib.check(lib.ferry_batch_info(handle, ctypes.byref(info)))
        self.epoch = info.epoch
        self.index = info.index
        self.seq = info.seq
        self.slot = info.slot
        self.num_samples = info.num_samples
        self._num_fields = info.num_fields
        # Read from the library on first use: a loader that caches views per slot never
        # needs them (one call per field per batch would be most of a handoff's cost).
        self._fields = None
        self._device = None

    @property
    def fields(self):
        """[(name, dtype code, shape tuple, data address, nbytes)], one per field."""
        if self._fields is None:
            lib, fields = self._lib, []
            sized = getattr(lib, "ferry_batch_field_sized", None)
            field = _lib.Field()
            for i in range(self._num_fields):
                if sized is not None:
                    _lib.check(sized(self._handle, i, ctypes.byref(field), ctypes.sizeof(field)))
                else:
                    _lib.check(lib.ferry_batch_field(self._handle, i, ctypes.byref(field)))
                shape = tuple(field.shape[d] for d in range(field.ndim))
                fields.append((field.name.decode(), field.dtype, shape, field.data or 0,
                               field.nbytes))
            self._fields = fields
        return self._fields

    @property
    def device(self):
        """CUDA ordinal of the fields' memory (this process's numbering), -1 for host memory."""
        if getattr(self, "_device", None) is None:
            fn = getattr(self._lib, "ferry_batch_device", None)
            if fn is None:  # ABI 1.0: the host transport only
                self._device = -1
            else:
                out = ctypes.c_int()
                _lib.check(fn(self._handle, ctypes.byref(out)))
                self._device = out.value
        return self._device

    @device.setter
    def device(self, value):
        self._device = value

    def arrays(self):
        """{field name: read-only numpy array viewing the slot} (zero-copy). Host batches
        only (device == -1); GPU batches use wait(), cuda_tensors() and release(stream)."""
        if self.device >= 0:
            raise FerryError("FAILED_PRECONDITION",
                             "this batch is in GPU memory (cuda:%d); use cuda_tensors()"
                             % self.device)
        out = {}
        for name, dtype, shape, data, nbytes in self.fields:
            np_dtype = NUMPY_DTYPES.get(dtype)
            if np_dtype is None:
                raise FerryError("UNIMPLEMENTED",
                                 "field '%s' has dtype code %d, unknown to this ferry package"
                                 % (name, dtype))
            if nbytes == 0:
                out[name] = np.empty(shape, np_dtype)
            else:
                out[name] = np.asarray(_ArrayView(data, shape, np_dtype, self))
        return out

    def release(self, stream=None):
        """Gives the slot back. Idempotent. GPU batches: `stream` (a cudaStream_t as an int,
        e.g. torch.cuda.current_stream().cuda_stream; 0 = legacy default stream) is where
        the slot's released event is recorded, after the work already enqueued there that
        reads the batch; None = the stream last passed to wait()."""
        if self._handle:
            if stream is None:
                _lib.check(self._lib.ferry_batch_release(self._handle))
            else:
                _lib.check(self._lib.ferry_batch_release_on(self._handle,
                                                            ctypes.c_void_p(int(stream))))

    def wait(self, stream):
        """GPU batches: makes `stream` (a cudaStream_t as an int; 0 = legacy default stream)
        wait, on the device, until the batch is in its slot. Returns at once; no-op for
        host batches."""
        if self._handle and self.device >= 0:
            _lib.check(self._lib.ferry_batch_wait(self._handle, ctypes.c_void_p(int(stream))))

    def cuda_tensors(self):
        """GPU batches: {field name: torch CUDA tensor viewing the slot} (zero-copy; each
        keeps this Batch alive). Call wait() on the stream that reads them first, and do
        not write to them: after release() ferryd overwrites them."""
        import torch
        if self.device < 0:
            raise FerryError("FAILED_PRECONDITION", "this batch is in host memory; use arrays()")
        device = torch.device("cuda", self.device)
        out = {}
        for name, dtype, shape, data, nbytes in self.fields:
            spec = _TORCH_VIEWS.get(dtype)
            if spec is None:
                raise FerryError("UNIMPLEMENTED",
                                 "field '%s' has dtype code %d, which ferry cannot hand to torch "
                                 "on the GPU" % (name, dtype))
            typestr, torch_dtype = spec
            if not hasattr(torch, torch_dtype):
                raise FerryError("UNIMPLEMENTED",
                                 "field '%s' is %s, which this torch (%s) has no dtype for on "
                                 "the GPU; torch >= 2.3 has it" % (name, torch_dtype,
                                                                   torch.__version__))
            if nbytes == 0:
                out[name] = torch.empty(shape, dtype=getattr(torch, torch_dtype), device=device)
                continue
            tensor = torch.as_tensor(_CudaView(data, shape, typestr, self), device=device)
            if torch_dtype == "bfloat16":
                tensor = tensor.view(torch.bfloat16)
            out[name] = tensor
        return out

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._handle = None
            self._lib.ferry_batch_free(handle)
