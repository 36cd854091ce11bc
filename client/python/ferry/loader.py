"""ferry.Loader: a DataLoader-like iterable over batches that ferryd prepares."""

import gc
import numbers
import os
import warnings
import weakref

import numpy as np

from ferry import _daemon, _lib, _resume, transforms
from ferry._arrays import _BFLOAT16_CODE, _needs_widening, _to_torch
from ferry._checks import _check_bool, _check_int, _check_path_like, _job_limit
from ferry._placement import (_parse_device, _resolve_rank, _torch_available,
                              _torch_cuda_device, _warn_if_not_local_rank_device)
from ferry._spec import _image_output, _job_spec, _refuse_dataloader_arguments
from ferry.crops import CenterCrop, RandomResizedCrop
from ferry.errors import FerryError

# How often a waiting iterator returns to Python, so Ctrl-C is handled promptly.
_POLL_MS = 200
# How long a Loader waits for a restarted ferryd (systemd's Restart=, an upgrade) to answer
# again before it gives up with the error that broke its stream; FERRY_REATTACH_SECONDS
# overrides it (0: give up at once).
_REATTACH_SECONDS = 60.0
# How long a Loader waits for ferryd to see the stream of a closed or collected Loader of the
# same rank end before it reports the rank as taken.
_TAKEOVER_SECONDS = 5.0

# Every open Loader of this process, to tell "your own earlier Loader still holds this rank"
# from "another process holds it".
_OPEN_LOADERS = weakref.WeakSet()


def _reattach_seconds():
    value = os.environ.get("FERRY_REATTACH_SECONDS")
    try:
        return float(value) if value else _REATTACH_SECONDS
    except ValueError:
        return _REATTACH_SECONDS


class Loader:
    """Iterates over one rank's batches of a ferry job, like torch's DataLoader.

        loader = ferry.Loader(ferry.ImageFolder("/data/train"), batch_size=256,
                              transform=ferry.RandomResizedCrop(224, flip=True),
                              shuffle=True, seed=0, rank=rank, world_size=world)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:   # {"image": uint8[B,224,224,3], "label": ..., "index": ...}
                ...

    Arguments:
      dataset: ImageFolder, WebDataset, Tokens, TokenShards, IndexedDataset, Records, Npy
        or a Blend of them (see docs/data.md).
      batch_size: samples per batch.
      transform: RandomResizedCrop or CenterCrop (required for images, unused for tokens).
      shuffle, seed, drop_last: as torch's DistributedSampler + BatchSampler; every rank
        gets the same number of batches (len(loader)).
      rank, world_size: this process's place in the training run (all nodes). Default:
        torch.distributed's rank and world size when it is initialized, else $RANK and
        $WORLD_SIZE (torchrun sets both), else 0 and 1, as DistributedSampler reads them. A
        value given that contradicts the launcher's is a ValueError naming both.
      device: "cpu" (host transport: batches in host memory) or "cuda:N" (GPU transport:
        batches are torch CUDA tensors on this process's device N, as torch numbers it;
        ferryd is told that GPU's PCI bus id, so CUDA_VISIBLE_DEVICES may differ between
        the trainer and ferryd). "cuda" is torch's current device; a torch.device is read
        the same way. Needs PyTorch with CUDA. Under torchrun, "cuda" that is not
        $LOCAL_RANK's device warns: call torch.cuda.set_device(local_rank) first.
      image_dtype: "uint8" (default: HWC as decoded), or with device "cuda:N" "float32",
        "float16" or "bfloat16": CHW, normalized on the GPU as (x / 255 - mean) / std.
      mean, std: 3 per-channel numbers for the normalized dtypes; None = torchvision's
        ImageNet values.
      address: ferryd's socket. None: $FERRY_ADDRESS if set, else the default socket, and
        when no ferryd answers there, this user's on-demand ferryd, started there by the
        first process that needs it and shared by all (see ferry._daemon); it stops by
        itself once no process has used it for FERRY_DAEMON_IDLE_SECONDS (default 30).
      prefetch: slots (batches in flight) for this rank; 0 (default) = the daemon's
        default: 4, more for small batches (up to 32, about 64 MiB of slots), which keeps
        the GPU's copy engine busy at thousands of batches per second.
      job_name: jobs with the same name and spec are shared (e.g. by all local ranks).
      as_numpy: yield numpy arrays even when torch is installed.
      zero_copy: False (default, safe): every batch is copied out of shared memory into
        fresh arrays and its slot released at once, so batches may be kept freely.
        True: the arrays view shared memory directly (read-only; writing to them crashes
        the process) and the slot is released when the iterator advances, after which
        ferryd overwrites the data: do not keep them past the next iteration.
        With device "cuda:N" nothing blocks the host: the current stream waits on the
        GPU for the batch; the safe mode clone()s each field on the current stream and
        releases the slot after the clones (ferryd's next copy into it waits for them);
        zero_copy yields views of the slot and releases it, after the work enqueued on the
        then current stream, when the iterator advances.
      timeout: seconds to wait for one batch before raising FerryError DEADLINE_EXCEEDED;
        None waits forever.
      on_corrupt_sample: "skip" (default): a sample that cannot be read or decoded is
        replaced by a deterministic substitute (same on every run and rank; the batch's
        "index" names it), counted and reported with its path in the job's status, and
        never read again. "fail": the first such sample stops the job; iteration raises
        FerryError DATA_LOSS naming the file.

    Batches are dicts {field name: tensor}; numpy arrays and torch tensors both support
    DLPack. Iterating again without set_epoch repeats the same epoch. Errors from ferryd
    raise ferry.FerryError; bad arguments raise TypeError/ValueError before any call.
    DataLoader's own arguments (num_workers, pin_memory, prefetch_factor, sampler, ...)
    raise a TypeError that names what does their job in ferry.
    A Loader is not thread-safe: iterate it from one thread.
    """

    def __init__(self, dataset, batch_size, transform=None, shuffle=False, seed=0,
                 drop_last=False, rank=None, world_size=None, device="cpu", address=None,
                 prefetch=0, job_name=None, as_numpy=False, zero_copy=False, timeout=None,
                 image_dtype="uint8", mean=None, std=None, on_corrupt_sample="skip",
                 **dataloader_arguments):
        _refuse_dataloader_arguments(dataloader_arguments)
        # Every dataset class of this module has _spec(); image datasets set _IMAGES.
        if not callable(getattr(dataset, "_spec", None)):
            raise TypeError("dataset must be a ferry dataset (ferry.ImageFolder, "
                            "ferry.WebDataset, ferry.Tokens, ferry.TokenShards, "
                            "ferry.IndexedDataset, ferry.Records, ferry.Npy or ferry.Blend), "
                            "got %r" % (dataset,))
        batch_size = _check_int("batch_size", batch_size, 1, _job_limit("batch_size"))
        if on_corrupt_sample not in ("skip", "fail"):
            raise ValueError("on_corrupt_sample must be 'skip' or 'fail', got %r"
                             % (on_corrupt_sample,))
        if getattr(dataset, "_IMAGES", False):
            if transform is None:
                raise ValueError("ImageFolder needs a transform: ferry.RandomResizedCrop(size) "
                                 "for training or ferry.CenterCrop(size) for evaluation")
        if transform is not None and not isinstance(
                transform, (RandomResizedCrop, CenterCrop, transforms.Compose, transforms._Op)):
            raise TypeError("transform must be ferry.RandomResizedCrop, ferry.CenterCrop or "
                            "ferry.transforms.Compose([...]) (or one ferry.transforms op), got "
                            "%r" % (transform,))
        if world_size is not None:
            world_size = _check_int("world_size", world_size, 1, _job_limit("world_size"))
        if rank is not None:
            rank = _check_int("rank", rank, 0)
        rank, world_size = _resolve_rank(rank, world_size)
        world_size = _check_int("world_size", world_size, 1, _job_limit("world_size"))
        rank = _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError("rank must be < world_size (%d), got %d" % (world_size, rank))
        seed = _check_int("seed", seed, 0, 2**64 - 1)
        cuda_ordinal = _parse_device(device)
        _warn_if_not_local_rank_device(device, cuda_ordinal)
        image_output = _image_output(dataset, cuda_ordinal, image_dtype, mean, std)
        if cuda_ordinal is not None and as_numpy is True:
            raise ValueError("as_numpy=True cannot hold GPU batches: use device='cpu', or "
                             "torch tensors with device=%r" % device)
        if address is not None:
            address = os.fspath(_check_path_like("address", address))
        if job_name is not None and not isinstance(job_name, str):
            raise TypeError("job_name must be a str, got %r" % (job_name,))
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError("timeout must be a number of seconds or None, got %r"
                                % (timeout,))
            if timeout <= 0:
                raise ValueError("timeout must be > 0, got %r" % (timeout,))
        self._spec = _job_spec(dataset, batch_size, transform, shuffle, seed, drop_last,
                               world_size, prefetch, image_output)
        if on_corrupt_sample == "fail":
            self._spec["on_corrupt_sample"] = "FAIL"
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._as_numpy = _check_bool("as_numpy", as_numpy) or not _torch_available()
        self._zero_copy = _check_bool("zero_copy", zero_copy)
        self._view_cache = {}  # slot views, see _host_batch and _cuda_views
        self._attaches = 1  # the consumer's, when _view_cache was last valid

        self._raw_stream = None  # see _current_stream
        self._timeout = timeout
        self._torch_device = None
        self._attach_device = None  # this rank's GPU, named at every attach
        if cuda_ordinal is not None:
            # The spec names no GPU, so the ranks of one run on different GPUs share the job;
            # each rank names its own when it attaches. The trainer's ordinal may not be
            # ferryd's: the GPU is named by its PCI bus id.
            self._torch_device = _torch_cuda_device(cuda_ordinal)
            from ferry import _lib
            self._spec["device"] = "cuda"
            self._attach_device = "cuda:" + _lib.cuda_pci_bus_id(cuda_ordinal)
        self._epoch = 0
        self._resume_batch = 0
        # A loaded state's positions of self._epoch that the next iteration leaves out (None:
        # none), and those the current iteration's deal left out with its batches per rank.
        self._resume_from = None
        self._epoch_base = []
        self._epoch_batches = 0
        self._known_bad = []  # quarantined samples named by a loaded state
        self._last_quarantined = []  # what ferryd said last (see _quarantined)
        self._batches_done = 0
        self._generation = 0
        self._daemon = None
        self._client = None
        self._consumer = None
        self._closed = False
        self._job_name = job_name
        try:
            self._connect(address)
            self.job = self._client.create_job(self._spec, name=job_name)
            self._consumer = self._attach_rank()
            self._len = self._consumer.batches_per_epoch
            self._epoch_batches = self._len
            self._epoch_info = self._consumer.epoch_info()  # for state_dict without ferryd
        except BaseException:
            self.close()
            raise
        self._finalizer = weakref.finalize(self, Loader._cleanup, self._consumer, self._client,
                                           self._daemon)
        _OPEN_LOADERS.add(self)

    def _rank_holder(self):
        """An open Loader of this process consuming this rank of this job, or None."""
        for other in list(_OPEN_LOADERS):
            if (other is not self and not other._closed and other._consumer is not None and
                    other.job.get("id") == self.job.get("id") and other.rank == self.rank):
                return other
        return None

    def _attach_rank(self):
        """Attaches as this Loader's rank. A rank whose earlier Loader in this process was
        closed or is garbage is taken over (libferry waits for ferryd to see that Loader's
        stream end, up to _TAKEOVER_SECONDS); one held by an open Loader of this process, or
        by another process, is refused with what to do."""
        name = self._job_name or self.job.get("name")
        if self._rank_holder() is not None:
            gc.collect()  # a Loader that is garbage but not collected yet closes now
            if self._rank_holder() is not None:
                raise FerryError("FAILED_PRECONDITION", "rank %d of job %r (%s) is held by "
                                 "another ferry.Loader of this process, which is still open: "
                                 "close it (loader.close()) or delete it, then create this one "
                                 "(a notebook cell run again: call close() on the old Loader "
                                 "first)" % (self.rank, name, self.job.get("id")),
                                 None, "RANK_HELD")
        self._client.set_held_rank_wait(_TAKEOVER_SECONDS)
        try:
            return self._client.attach(self.job["id"], self.rank, self._attach_device)
        except FerryError as e:
            if e.reason != "RANK_HELD":
                raise
            pid = self._consumer_pid()
            raise FerryError("FAILED_PRECONDITION", "rank %d of job %r (%s) is being "
                             "consumed by %s; a rank has one consumer at a time: stop that "
                             "process, or use another rank or job_name"
                             % (self.rank, name, self.job.get("id"),
                                "process %d" % pid if pid else "another process"),
                             e.code_value, e.reason)

    def _consumer_pid(self):
        """The pid ferryd reports for this rank's consumer (0 if unknown)."""
        try:
            for r in self._client.get_job(self.job["id"]).get("ranks", ()):
                if int(r.get("rank", 0)) == self.rank and r.get("attached"):
                    return int(r.get("consumer_pid", 0))
        except FerryError:
            pass
        return 0

    def _connect(self, address):
        """Connects, and has libferry take the job back on a restarted ferryd (systemd's
        Restart=, an upgrade) for up to FERRY_REATTACH_SECONDS, going on with the epoch
        where it was; an on-demand daemon that died is started again first."""
        from ferry.client import Client
        if address is None and os.environ.get("FERRY_ADDRESS"):
            address = os.environ["FERRY_ADDRESS"]
        if address is not None:
            self._client = Client(address)
        else:
            try:
                self._client = Client(None)
            except FerryError as e:
                if e.code not in ("NOT_FOUND", "UNAVAILABLE"):
                    raise
                self._client = self._on_demand_client()
        hook = None
        if self._daemon is not None:
            me = weakref.ref(self)  # the client holds the hook: no cycle through the Loader

            def hook():
                loader = me()
                if loader is not None:
                    loader._restart_on_demand_daemon()
        if _lib.minor() >= 8:  # ferry_client_set_reattach
            self._client.set_reattach(_reattach_seconds(), hook)

    def _on_demand_client(self):
        """A client of this user's on-demand ferryd at the default socket, started if no
        daemon answers there (see ferry._daemon)."""
        from ferry.client import Client
        self._daemon = _daemon.ensure(_daemon.on_demand_address())
        return Client(self._daemon.address)

    @staticmethod
    def _cleanup(consumer, client, daemon):
        # The on-demand daemon (`daemon`) stops by itself once no client is left.
        if consumer is not None:
            consumer.close()
        if client is not None:
            client.close()

    @property
    def address(self):
        """The socket of the on-demand ferryd this Loader started or joined; None when it
        uses an address it was given or a daemon that was already running."""
        return self._daemon.address if self._daemon else None

    def __len__(self):
        return self._len

    def set_epoch(self, epoch):
        """Selects the epoch the next iteration delivers (shuffle order depends on it). After
        load_state_dict, setting the state's epoch keeps its position (the usual
        `loader.set_epoch(epoch)` at the top of a resumed loop goes on where the state was,
        as torchdata's StatefulDataLoader does); another epoch starts at its first batch."""
        epoch = _check_int("epoch", epoch, 0)
        if epoch != self._epoch:
            self._resume_batch = 0
            self._resume_from = None
        self._epoch = epoch

    def state_dict(self):
        """Position for an exact resume, on any world size and batch size: the epoch and the
        positions of its order the whole run has consumed (the same on every rank of a run in
        step, so any rank's state will do), how this run was dealt them, what fixes the order
        (dataset, seed, shuffle), and the samples ferryd has quarantined so far (a ferryd
        started later reads none of them either). A JSON-able dict with a checksum; docs/data.md, "Resuming on
        another number of GPUs"."""
        if self._resume_from is not None:  # loaded and not iterated yet
            base, done, batches = self._resume_from, self._resume_batch, 0
        else:
            base, done, batches = self._epoch_base, self._batches_done, self._epoch_batches
        return _resume.make(self._epoch, self._epoch_info, base, done, batches, self._spec,
                            self._quarantined())

    def load_state_dict(self, state):
        """Makes the next iteration resume where `state` (from state_dict) is. With the world
        size, batch size and drop_last the state was saved with, the run continues its deal
        at the same batch; with others, the positions of the epoch not yet consumed are dealt
        to this run's ranks as a fresh epoch is, so every sample of the epoch is delivered
        once across the two runs. A state taken after the last batch of an epoch resumes at
        the first batch of the next. Every rank of the run must load the same state.
        ValueError naming what differs for a state of another dataset, seed or shuffle.
        Passes the state's quarantined samples on to ferryd.

        The older form {"epoch", "batches_done"} is read as saved at this Loader's world
        size and batch size (it does not say which it was)."""
        if not isinstance(state, dict):
            raise TypeError("state must be a dict from state_dict(), got %r" % (state,))
        quarantined = [_check_int("state['quarantined'] entries", i, 0)
                       for i in state.get("quarantined", ())]
        if "format" in state:
            plan = _resume.read(state, self._epoch_info, self._spec)
            epoch, base, done = plan.epoch, plan.base, plan.first_batch
        else:
            epoch = _check_int("state['epoch']", state["epoch"], 0)
            done = _check_int("state['batches_done']", state["batches_done"], 0, self._len)
            base = []
            warnings.warn("ferry: this resume state has no world size or batch size (it was "
                          "saved by an older ferry); it is read as saved with world_size=%d "
                          "and batch_size=%d. If it was not, samples are lost or repeated in "
                          "this epoch" % (self.world_size, self.batch_size), stacklevel=2)
            if done == self._len:
                epoch, done = epoch + 1, 0
        self._epoch, self._resume_batch, self._batches_done = epoch, done, done
        self._resume_from = base
        self._known_bad = sorted(set(self._known_bad) | set(quarantined))
        if self._known_bad:
            self._client.quarantine(self.job["id"], self._known_bad)

    def job_status(self):
        """The job's status as ferryd reports it now (ferry.v1.JobStatus as a dict, proto
        field names): "ranks", "errors", "samples_decoded", for a Blend "blend_sources"
        (per dataset: "name", "weight", "samples_per_epoch", "samples_drawn"), and for a GPU
        image job "gpu_decode" (who decodes its JPEGs: "mode" or "off", "gpu_images",
        "cpu_images", "fallbacks", "gpu_share"; docs/operations.md), and for a remote image
        folder or WebDataset "read_ahead" (files "opened" ahead of the workers, "skipped",
        "failed", "files_in_window", "bytes_in_window")."""
        if self._client is None:
            raise FerryError("FAILED_PRECONDITION", "the ferry.Loader is closed")
        return self._client.get_job(self.job["id"])

    def _quarantined(self):
        """Indices ferryd has quarantined in this job (and those a loaded state named). A
        state is often saved because something failed: with ferryd unreachable this is what
        it said last."""
        if self._client is not None:
            try:
                status = self._client.get_job(self.job["id"])
                self._last_quarantined = [int(i) for i in status.get("quarantined_indices", ())]
            except FerryError:
                pass
        return sorted(set(self._last_quarantined) | set(self._known_bad))

    def __iter__(self):
        if self._closed:
            raise FerryError("FAILED_PRECONDITION", "the ferry.Loader is closed")
        self._generation += 1
        first, self._resume_batch = self._resume_batch, 0
        base, self._resume_from = self._resume_from or [], None
        self._epoch_base = base
        # start_epoch may attach again (new slot mappings): views of old slots are stale.
        self._view_cache.clear()
        self._batches_done = first
        # After a ferryd restart libferry takes the job back first (see _connect), also when
        # an earlier attempt gave up.
        self._wrap(self._start_epoch, first)
        return self._iterate(self._generation)

    def _start_epoch(self, first):
        """Starts self._epoch at batch `first` of its deal (after self._epoch_base)."""
        if self._epoch_base:
            self._epoch_batches = self._consumer.resume_epoch(self._epoch, self._epoch_base,
                                                              first)
        else:
            self._consumer.start_epoch(self._epoch, first)
            self._epoch_batches = self._len

    def _release_held(self, held, held_by):
        """Releases the batch the caller had; a batch of a stream that is gone (ferryd
        restarted and libferry took the job back) has nothing to give back."""
        if held_by is not self._consumer:
            return
        try:
            self._release(held)
        except FerryError as e:
            if e.code != "UNAVAILABLE":
                raise  # else _next_batch meets the same break and libferry reattaches

    def _iterate(self, generation):
        held = None  # zero-copy: the batch whose arrays the caller has now
        held_by = None  # the consumer it came from
        try:
            while True:
                if generation != self._generation or self._closed:
                    raise RuntimeError("this ferry.Loader iterator was superseded by a newer "
                                       "iteration (or the Loader was closed)")
                if held is not None:
                    self._release_held(held, held_by)
                    held = None
                batch = self._next_batch()
                if batch is None:
                    return
                self._batches_done = batch.index + 1
                if self._torch_device is not None:
                    tensors, held = self._gpu_batch(batch)
                    held_by = self._consumer
                    yield tensors
                    continue
                arrays = self._host_batch(batch)
                if self._zero_copy:
                    held, held_by = batch, self._consumer
                else:
                    self._release_held(batch, self._consumer)
                yield arrays
        finally:
            if held is not None:
                try:
                    self._release_held(held, held_by)
                except FerryError:
                    pass

    def _current_stream(self):
        """The current CUDA stream of the Loader's device, as a cudaStream_t int."""
        if self._raw_stream is None:
            import torch
            # torch's raw getter returns the same int as current_stream(...).cuda_stream
            # without building a Stream object (about 8 us of a handoff otherwise).
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            index = self._torch_device.index
            self._raw_stream = ((lambda: raw(index)) if raw is not None else
                                (lambda: torch.cuda.current_stream(self._torch_device)
                                 .cuda_stream))
        return self._raw_stream()

    def _release(self, batch):
        if self._torch_device is not None:
            # After whatever the caller enqueued on the current stream with the views.
            batch.release(self._current_stream())
        else:
            batch.release()

    def _host_batch(self, batch):
        """The arrays (or tensors) to yield for a host batch: views of the slab in zero-copy
        mode, else copies. Views are made once per (slot, rows), as for GPU slots (see
        _cuda_views): the slab is mapped once per attach, and making them costs more than
        the rest of a handoff (ctypes calls per field, torch's read-only warning)."""
        key = (batch.slot, batch.num_samples)
        views = self._view_cache.get(key)
        if views is None:
            views = batch.arrays()
            if not self._as_numpy:
                bf16 = {f[0] for f in batch.fields if f[1] == _BFLOAT16_CODE}
                # uint16/uint32 fields stay numpy arrays: torch has no such dtypes, so each
                # batch widens them (a copy either way). bfloat16 arrives as uint16 bits.
                views = {k: v if k not in bf16 and _needs_widening(v) else
                         _to_torch(k, v, copy=False, bfloat16=k in bf16)
                         for k, v in views.items()}

            if len(self._view_cache) >= 256:
                self._view_cache.clear()
            self._view_cache[key] = views
        # Zero-copy yields fresh views of the cached ones (view(), detach(): under a
        # microsecond), so a caller's in-place reshaping (unsqueeze_, resize_,
        # requires_grad_) never reaches a later batch of the same slot.
        if self._as_numpy:
            return ({k: v.view() for k, v in views.items()} if self._zero_copy else
                    {k: v.copy() for k, v in views.items()})
        out = {}
        for k, v in views.items():
            if isinstance(v, np.ndarray):  # to widen
                out[k] = _to_torch(k, v, copy=True)
            else:
                out[k] = v.detach() if self._zero_copy else v.clone()
        return out

    def _gpu_batch(self, batch):
        """(tensors to yield, batch still held or None). Nothing here waits on the host."""
        views = self._view_cache.get((batch.slot, batch.num_samples))
        if views is None:
            if batch.device != self._torch_device.index:
                raise FerryError("INTERNAL", "ferryd's GPU batch arrived on cuda:%d, not on %s "
                                 "(whose PCI bus id the job names)"
                                 % (batch.device, self._torch_device))
        else:
            # Cached views exist only for this attach's batches, all on the checked device:
            # saves batch.wait() asking the library (a ctypes call per batch).
            batch.device = self._torch_device.index
        stream = self._current_stream()
        batch.wait(stream)
        views = dict(views) if views is not None else self._cuda_views(batch)
        if self._zero_copy:  # fresh views, as in _host_batch
            return {k: v.detach() for k, v in views.items()}, batch
        # clone() runs on the current stream after the wait, and the released event is
        # recorded after the clones on that same stream: ferryd cannot overwrite early.
        tensors = {k: v.clone() for k, v in views.items()}
        del views
        batch.release(stream)
        return tensors, None

    def _cuda_views(self, batch):
        """Tensors viewing the batch's device slot. A slot's memory is mapped once per attach,
        so its views are made once per (slot, rows) and reused (building a tensor from
        __cuda_array_interface__ costs tens of microseconds per field). The consumer attaches
        again only when an iteration starts, which clears the cache (see __iter__)."""
        key = (batch.slot, batch.num_samples)
        views = self._view_cache.get(key)
        if views is None:
            views = batch.cuda_tensors()
            if len(self._view_cache) >= 256:
                self._view_cache.clear()
            self._view_cache[key] = views
        return dict(views)

    def _next_batch(self):
        waited = 0.0
        while True:
            try:
                batch = self._wrap(self._consumer.next, _POLL_MS)
                attaches = self._consumer.attaches
                if attaches != self._attaches:  # libferry reattached: new slot mappings
                    self._view_cache.clear()
                    self._attaches = attaches
                return batch
            except FerryError as e:
                if e.reason != "NO_BATCH_YET":
                    raise
            waited += _POLL_MS / 1000.0
            if self._timeout is not None and waited >= self._timeout:
                raise FerryError("DEADLINE_EXCEEDED", "no batch from ferryd within %g s "
                                 "(epoch %d, after batch %d)"
                                 % (self._timeout, self._epoch, self._batches_done))

    def _restart_on_demand_daemon(self):
        """libferry's hook before it connects to a restarted ferryd: an on-demand daemon
        (see ferry._daemon) that died is started again."""
        self._daemon = _daemon.ensure(_daemon.on_demand_address())

    def _wrap(self, fn, *args):
        """Calls fn; adds the on-demand daemon's fate to errors, since its death is the
        likeliest cause of a broken stream."""
        try:
            return fn(*args)
        except FerryError as e:
            if self._daemon is not None:
                how = self._daemon.describe_exit()
                if how:
                    raise FerryError(e.code, "%s (%s)" % (e.message, how), e.code_value) from e
            raise

    def close(self):
        """Detaches (ferryd reclaims this rank's slots). An on-demand daemon stops by itself
        once no process uses it. Idempotent; also done at garbage collection and interpreter
        exit."""
        self._closed = True
        getattr(self, "_view_cache", {}).clear()  # views of slots about to be unmapped
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        else:
            Loader._cleanup(self._consumer, self._client, self._daemon)
        self._consumer = self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
