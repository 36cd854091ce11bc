"""ferry.Loader: a DataLoader-like iterable over batches that ferryd prepares."""

import gc
import math
import numbers
import os
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from ferry import _daemon, _resume, transforms
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


def _check_path(name, value):
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError("%s must be a path (str or os.PathLike), got %r" % (name, value))
    value = os.fspath(value)
    if not value:
        raise ValueError("%s must not be empty" % name)
    return os.path.abspath(value)  # ferryd resolves paths itself: it needs absolute ones


def _check_range(name, value):
    if (not isinstance(value, (tuple, list)) or len(value) != 2 or
            not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)):
        raise TypeError("%s must be a pair of numbers, got %r" % (name, value))
    lo, hi = float(value[0]), float(value[1])
    if not 0 < lo <= hi:
        raise ValueError("%s must satisfy 0 < min <= max, got %r" % (name, value))
    return lo, hi


# ---------------------------------------------------------------------------------------
# Datasets and transforms: validated on construction, turned into ferry.v1.JobSpec JSON.

class ImageFolder:
    """root/<class>/<file>; label = index of the class directory in sorted order. Files named
    .jpg, .jpeg or .png (any case) are read, each decoded by its content (JPEG or PNG; a PNG
    comes out as PIL's convert("RGB") gives it). exif_orientation: turn each image upright
    by its EXIF Orientation tag first, as PIL.ImageOps.exif_transpose does (default False,
    as with PIL and torchvision). Batches: {"image": uint8[B, H, W, 3], "label": int64[B],
    "index": int64[B]}."""

    _IMAGES = True

    def __init__(self, root, exif_orientation=False):
        self.root = _check_path("ImageFolder root", root)
        self.exif_orientation = _check_bool("ImageFolder exif_orientation", exif_orientation)

    def _spec(self):
        spec = {"root": self.root}
        if self.exif_orientation:  # only when set: a ferryd before the option accepts the rest
            spec["exif_orientation"] = True
        return {"image_folder": spec}

    def __repr__(self):
        if self.exif_orientation:
            return "ImageFolder(%r, exif_orientation=True)" % self.root
        return "ImageFolder(%r)" % self.root


def _absolute_shard_pattern(pattern):
    """Makes a shard pattern absolute without touching its brace groups: only the directory
    before the first '{' is resolved ("data/{a,b}.tar" -> "/cwd/data/{a,b}.tar")."""
    brace = pattern.find("{")
    head, rest = (pattern, "") if brace < 0 else (pattern[:brace], pattern[brace:])
    directory, slash, name = head.rpartition("/")
    if slash and not directory:
        directory = "/"
    return os.path.join(os.path.abspath(directory or "."), name) + rest


class WebDataset:
    """WebDataset tar shards: a sample is the run of consecutive members sharing a basename
    ("n01_0001.jpg", "n01_0001.cls"). `shards`: a path or list of paths, each may hold brace
    groups ("/data/train-{000000..000146}.tar", "{train,extra}.tar"). image_key: extension
    of the image member ("jpg" also matches "jpeg"; "png"), decoded by its content (JPEG or
    PNG); label_key: extension of the member holding the label as decimal text (label -1 when
    a sample has none). exif_orientation: as ImageFolder's. With shuffle=True the epoch's
    order is: shards permuted, then a shuffle buffer of `shuffle_buffer` samples; each rank
    reads a contiguous run of it. Batches: {"image": uint8[B, H, W, 3], "label": int64[B],
    "index": int64[B]}."""

    _IMAGES = True

    def __init__(self, shards, image_key="jpg", label_key="cls", shuffle_buffer=1000,
                 exif_orientation=False):
        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        if not isinstance(shards, (list, tuple)) or not shards:
            raise TypeError("WebDataset shards must be a path or a non-empty list of paths, "
                            "got %r" % (shards,))
        checked = []
        for i, shard in enumerate(shards):
            if not isinstance(shard, (str, os.PathLike)):
                raise TypeError("WebDataset shards[%d] must be a path (str or os.PathLike), "
                                "got %r" % (i, shard))
            shard = os.fspath(shard)
            if not shard:
                raise ValueError("WebDataset shards[%d] must not be empty" % i)
            checked.append(_absolute_shard_pattern(shard))
        self.shards = checked
        for name, key in (("image_key", image_key), ("label_key", label_key)):
            if not isinstance(key, str) or not key.strip("."):
                raise ValueError("WebDataset %s must be a member extension such as 'jpg', got %r"
                                 % (name, key))
        self.image_key = image_key
        self.label_key = label_key
        self.shuffle_buffer = _check_int("WebDataset shuffle_buffer", shuffle_buffer, 1,
                                         2**32 - 1)
        self.exif_orientation = _check_bool("WebDataset exif_orientation", exif_orientation)

    def _spec(self):
        spec = {"shards": list(self.shards), "image_key": self.image_key,
                "label_key": self.label_key, "shuffle_buffer": self.shuffle_buffer}
        if self.exif_orientation:  # as ImageFolder's
            spec["exif_orientation"] = True
        return {"webdataset": spec}

    def __repr__(self):
        return "WebDataset(%r, image_key=%r, label_key=%r, shuffle_buffer=%d%s)" % (
            self.shards if len(self.shards) != 1 else self.shards[0], self.image_key,
            self.label_key, self.shuffle_buffer,
            ", exif_orientation=True" if self.exif_orientation else "")


class Tokens:
    """A flat binary file of little-endian token ids (dtype "uint16" or "uint32"); a sample
    is seq_len + 1 tokens. Batches: {"tokens": output_dtype[B, seq_len + 1], "index": ...}.

    widen_on_host: with a GPU device, ferryd's workers widen the tokens and the copy engine
    moves the wider rows, instead of a kernel of ferryd's widening them on the GPU. That
    kernel takes turns on the GPU with a computing trainer's (without MPS): set it for
    compute-bound trainers; an input-bound one is faster without it."""

    _TOKEN_DTYPES = {"uint16": "UINT16", "uint32": "UINT32"}
    _OUTPUT_DTYPES = {"int64": "INT64", "int32": "INT32"}

    def __init__(self, path, seq_len, dtype="uint16", output_dtype="int64",
                 widen_on_host=False):
        self.path = _check_path("Tokens path", path)
        self.seq_len = _check_int("seq_len", seq_len, 1, 2**32 - 2)
        if dtype not in self._TOKEN_DTYPES:
            raise ValueError("Tokens dtype must be one of %s, got %r"
                             % (sorted(self._TOKEN_DTYPES), dtype))
        if output_dtype not in self._OUTPUT_DTYPES:
            raise ValueError("Tokens output_dtype must be one of %s, got %r"
                             % (sorted(self._OUTPUT_DTYPES), output_dtype))
        self.dtype = dtype
        self.output_dtype = output_dtype
        self.widen_on_host = _check_bool("widen_on_host", widen_on_host)

    def _spec(self):
        spec = {"path": self.path, "seq_len": self.seq_len,
                "token_dtype": self._TOKEN_DTYPES[self.dtype],
                "output_dtype": self._OUTPUT_DTYPES[self.output_dtype]}
        if self.widen_on_host:  # left out otherwise: a ferryd without the field accepts it
            spec["widen_on_host"] = True
        return {"tokens": spec}

    def __repr__(self):
        return "Tokens(%r, seq_len=%d, dtype=%r)" % (self.path, self.seq_len, self.dtype)


class TokenShards:
    """Sharded flat token files (nanoGPT-style .bin shards of little-endian "uint16" or
    "uint32" ids), taken in the listed order. `shards`: a path or list of paths, each may
    hold brace groups ("/data/train-{000..127}.bin", "{a,b}.bin"). A sample is seq_len + 1
    tokens; window j of a shard starts at its token j * seq_len, so a shard of n tokens holds
    (n - 1) // seq_len windows and no window straddles two files, unless
    windows_cross_files=True: the shards are then one stream (their concatenation). The
    epoch's order shuffles all windows of all shards; every rank gets the same count.
    Batches: {"tokens": output_dtype[B, seq_len + 1], "index": int64[B]}. widen_on_host: as
    for ferry.Tokens."""

    def __init__(self, shards, seq_len, dtype="uint16", output_dtype="int64",
                 windows_cross_files=False, widen_on_host=False):
        if isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        if not isinstance(shards, (list, tuple)) or not shards:
            raise TypeError("TokenShards shards must be a path or a non-empty list of paths, "
                            "got %r" % (shards,))
        checked = []
        for i, shard in enumerate(shards):
            if not isinstance(shard, (str, os.PathLike)):
                raise TypeError("TokenShards shards[%d] must be a path (str or os.PathLike), "
                                "got %r" % (i, shard))
            shard = os.fspath(shard)
            if not shard:
                raise ValueError("TokenShards shards[%d] must not be empty" % i)
            checked.append(_absolute_shard_pattern(shard))
        self.shards = checked
        self.seq_len = _check_int("seq_len", seq_len, 1, 2**32 - 2)
        if dtype not in Tokens._TOKEN_DTYPES:
            raise ValueError("TokenShards dtype must be one of %s, got %r"
                             % (sorted(Tokens._TOKEN_DTYPES), dtype))
        if output_dtype not in Tokens._OUTPUT_DTYPES:
            raise ValueError("TokenShards output_dtype must be one of %s, got %r"
                             % (sorted(Tokens._OUTPUT_DTYPES), output_dtype))
        self.dtype = dtype
        self.output_dtype = output_dtype
        self.windows_cross_files = _check_bool("windows_cross_files", windows_cross_files)
        self.widen_on_host = _check_bool("widen_on_host", widen_on_host)

    def _spec(self):
        spec = {"shards": list(self.shards), "seq_len": self.seq_len,
                "token_dtype": Tokens._TOKEN_DTYPES[self.dtype],
                "output_dtype": Tokens._OUTPUT_DTYPES[self.output_dtype]}
        if self.windows_cross_files:
            spec["windows_cross_files"] = True
        if self.widen_on_host:
            spec["widen_on_host"] = True
        return {"token_shards": spec}

    def __repr__(self):
        return "TokenShards(%r, seq_len=%d, dtype=%r, windows_cross_files=%r)" % (
            self.shards if len(self.shards) != 1 else self.shards[0], self.seq_len, self.dtype,
            self.windows_cross_files)


class IndexedDataset:
    """A Megatron-LM indexed dataset: `path_prefix` + ".bin" (uint16 or int32 token ids) and
    + ".idx" (MMIDIDX version 1). The sequences are packed in file order and cut into
    samples of seq_len + 1 tokens starting at index * seq_len (documents continue across
    samples). Batches: {"tokens": output_dtype[B, seq_len + 1], "index": int64[B]}, plus
    with position_ids=True "position_ids": output_dtype[B, seq_len + 1] (restarting at 0 at
    each document start in the sample), and with cu_seqlens=True "cu_seqlens": int32[B,
    seq_len + 1] and "num_seqs": int32[B]: row b's cu_seqlens[:num_seqs + 1] are
    FlashAttention's varlen boundaries of its seq_len inputs (padded with seq_len).
    widen_on_host: as for ferry.Tokens."""

    def __init__(self, path_prefix, seq_len, output_dtype="int64", position_ids=False,
                 cu_seqlens=False, widen_on_host=False):
        self.path_prefix = _check_path("IndexedDataset path_prefix", path_prefix)
        for ext in (".bin", ".idx"):
            if self.path_prefix.endswith(ext):
                raise ValueError("IndexedDataset path_prefix is the path without %s, got %r"
                                 % (ext, path_prefix))
        self.seq_len = _check_int("seq_len", seq_len, 1, 2**31 - 2)
        if output_dtype not in Tokens._OUTPUT_DTYPES:
            raise ValueError("IndexedDataset output_dtype must be one of %s, got %r"
                             % (sorted(Tokens._OUTPUT_DTYPES), output_dtype))
        self.output_dtype = output_dtype
        self.position_ids = _check_bool("position_ids", position_ids)
        self.cu_seqlens = _check_bool("cu_seqlens", cu_seqlens)
        self.widen_on_host = _check_bool("widen_on_host", widen_on_host)

    def _spec(self):
        spec = {"path_prefix": self.path_prefix, "seq_len": self.seq_len,
                "output_dtype": Tokens._OUTPUT_DTYPES[self.output_dtype]}
        if self.position_ids:
            spec["position_ids"] = True
        if self.cu_seqlens:
            spec["cu_seqlens"] = True
        if self.widen_on_host:
            spec["widen_on_host"] = True
        return {"indexed": spec}

    def __repr__(self):
        return "IndexedDataset(%r, seq_len=%d, position_ids=%r, cu_seqlens=%r)" % (
            self.path_prefix, self.seq_len, self.position_ids, self.cu_seqlens)


class Blend:
    """Several datasets mixed by weight, deterministically (Megatron-LM's BlendedDataset):

        data = ferry.Blend([ferry.IndexedDataset("/data/wiki", 2048),
                            ferry.TokenShards("/data/web-{000..127}.bin", 2048)],
                           weights=[0.3, 0.7], names=["wiki", "web"])

    An epoch has samples_per_epoch samples (default: the sum of the datasets' sizes), drawn
    from each dataset in proportion to its weight (within one sample over any prefix of the
    blend's order; shuffled batches follow the weights statistically). A dataset is read in
    whole passes, each in an order of its own from (seed, dataset, pass) when shuffling, so
    one weighted above its size repeats only after all of it was read, and one weighted
    below reads new samples each epoch. Batches are the datasets' own fields, which must
    agree (same seq_len, output_dtype, options); "index" numbers the first dataset's samples,
    then the second's, ... The per-dataset counts are in the job's status
    (Loader.job_status()["blend_sources"]) and docs/data.md says more."""

    def __init__(self, datasets, weights, names=None, samples_per_epoch=None):
        if not isinstance(datasets, (list, tuple)) or not datasets:
            raise TypeError("Blend datasets must be a non-empty list of ferry datasets, got %r"
                            % (datasets,))
        for i, d in enumerate(datasets):
            if isinstance(d, Blend) or not callable(getattr(d, "_spec", None)):
                raise TypeError("Blend datasets[%d] must be a ferry dataset other than a Blend, "
                                "got %r" % (i, d))
        if not isinstance(weights, (list, tuple)) or len(weights) != len(datasets):
            raise ValueError("Blend weights must be a list of %d numbers (one per dataset), "
                             "got %r" % (len(datasets), weights))
        checked = []
        for i, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (
                    0 < w < float("inf")):
                raise ValueError("Blend weights[%d] must be a positive finite number, got %r"
                                 % (i, w))
            checked.append(float(w))
        if names is not None:
            if not isinstance(names, (list, tuple)) or len(names) != len(datasets):
                raise ValueError("Blend names must be a list of %d strings, got %r"
                                 % (len(datasets), names))
            for i, n in enumerate(names):
                if not isinstance(n, str) or not n:
                    raise ValueError("Blend names[%d] must be a non-empty string, got %r"
                                     % (i, n))
            if len(set(names)) != len(names):
                raise ValueError("Blend names must differ, got %r" % (names,))
        self.datasets = list(datasets)
        self.weights = checked
        self.names = list(names) if names is not None else None
        self.samples_per_epoch = (None if samples_per_epoch is None else
                                  _check_int("samples_per_epoch", samples_per_epoch, 1,
                                             2**63 - 1))
        self._IMAGES = any(getattr(d, "_IMAGES", False) for d in datasets)

    def _spec(self):
        sources = []
        for i, (d, w) in enumerate(zip(self.datasets, self.weights)):
            source = {"dataset": d._spec(), "weight": w}
            if self.names is not None:
                source["name"] = self.names[i]
            sources.append(source)
        spec = {"sources": sources}
        if self.samples_per_epoch is not None:
            spec["samples_per_epoch"] = str(self.samples_per_epoch)
        return {"blend": spec}

    def __repr__(self):
        return "Blend(%r, weights=%r%s)" % (
            self.datasets, self.weights,
            "" if self.names is None else ", names=%r" % (self.names,))


class Records:
    """A flat file of fixed-size binary records (little-endian) after header_bytes; a sample
    is one record of `dtype` and `shape` (() = one scalar). Batches:
    {"data": dtype[B, *shape], "index": int64[B]}.

    dtype: "uint8", "uint16", "uint32", "int32", "int64", "float16", "bfloat16" or
    "float32". As torch tensors, uint16 / uint32 data is widened to int32 / int64 (torch has
    no such tensors) and bfloat16 is torch.bfloat16; as numpy arrays (as_numpy=True or no
    torch), bfloat16 comes as uint16 arrays holding the raw bits (numpy has no bfloat16):
    torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) turns them into values."""

    _DTYPES = {"uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "int32": "INT32",
               "int64": "INT64", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
               "float32": "FLOAT32"}

    def __init__(self, path, dtype, shape=(), header_bytes=0):
        self.path = _check_path("Records path", path)
        if not isinstance(dtype, str) or dtype not in self._DTYPES:
            raise ValueError("Records dtype must be one of %s, got %r"
                             % (sorted(self._DTYPES), dtype))
        self.dtype = dtype
        if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
            shape = (shape,)
        if not isinstance(shape, (tuple, list)):
            raise TypeError("Records shape must be a tuple of ints (() for one scalar per "
                            "record), got %r" % (shape,))
        self.shape = tuple(_check_int("Records shape[%d]" % i, d, 1)
                           for i, d in enumerate(shape))
        self.header_bytes = _check_int("Records header_bytes", header_bytes, 0, 2**64 - 1)

    def _spec(self):
        return {"records": {"path": self.path, "dtype": self._DTYPES[self.dtype],
                            "shape": [str(d) for d in self.shape],
                            "header_bytes": str(self.header_bytes)}}

    def __repr__(self):
        return "Records(%r, dtype=%r, shape=%r, header_bytes=%d)" % (
            self.path, self.dtype, self.shape, self.header_bytes)


class Npy:
    """A NumPy .npy file (np.save: format 1.0-3.0, C order, little-endian) of dtype uint8,
    uint16, uint32, int32, int64, float16 or float32; a sample is one row along axis 0.
    Batches: {"data": dtype[B, *array.shape[1:]], "index": int64[B]} (a 1-d array gives
    data[B]). ferryd memory-maps the file; it refuses other dtypes, big-endian and Fortran
    order arrays with what to do."""

    def __init__(self, path):
        self.path = _check_path("Npy path", path)

    def _spec(self):
        return {"npy": {"path": self.path}}

    def __repr__(self):
        return "Npy(%r)" % self.path


class RandomResizedCrop:
    """torchvision's RandomResizedCrop(size, scale, ratio), then RandomHorizontalFlip(0.5)
    when flip is set. full_decode: decode each JPEG at full resolution as torchvision does;
    by default ferry decodes at the smallest DCT scale (1/2, 1/4, 1/8) that still gives the
    crop `size` pixels a side, which is faster and differs by a little (docs/data.md,
    "Reduced-scale decode")."""

    def __init__(self, size, scale=transforms._CROP_SCALE, ratio=transforms._CROP_RATIO,
                 flip=False, full_decode=False):
        self.size = _check_int("RandomResizedCrop size", size, 1, 65535)
        self.scale = _check_range("RandomResizedCrop scale", scale)
        if self.scale[1] > 1.0:
            raise ValueError("RandomResizedCrop scale must be at most 1.0, got %r" % (scale,))
        self.ratio = _check_range("RandomResizedCrop ratio", ratio)
        self.flip = _check_bool("RandomResizedCrop flip", flip)
        self.full_decode = _check_bool("RandomResizedCrop full_decode", full_decode)

    def _spec(self):
        spec = {"size": self.size, "scale_min": self.scale[0], "scale_max": self.scale[1],
                "ratio_min": self.ratio[0], "ratio_max": self.ratio[1], "flip": self.flip}
        if self.full_decode:  # only when set: a ferryd before the option accepts the rest
            spec["full_decode"] = True
        return {"random_resized_crop": spec}


class CenterCrop:
    """torchvision's Resize(resize) (shorter side) then CenterCrop(size). Default resize:
    size * 256 / 224. full_decode: as for RandomResizedCrop."""

    def __init__(self, size, resize=None, full_decode=False):
        self.size = _check_int("CenterCrop size", size, 1, 65535)
        self.resize = 0 if resize is None else _check_int("CenterCrop resize", resize,
                                                          self.size, 65535)
        self.full_decode = _check_bool("CenterCrop full_decode", full_decode)

    def _spec(self):
        spec = {"size": self.size, "resize": self.resize}
        if self.full_decode:
            spec["full_decode"] = True
        return {"center_crop": spec}


# ---------------------------------------------------------------------------------------

# FERRY_DTYPE_BFLOAT16: numpy has no bfloat16, so ferry.client hands its bits over as uint16.
_BFLOAT16_CODE = 7


def _needs_widening(array):
    """True for arrays that _to_torch widens (torch 1.x has no uint16/uint32 tensors)."""
    import numpy as np
    return array.dtype == np.uint16 or array.dtype == np.uint32


def _to_torch(name, array, copy, bfloat16=False):
    import torch
    import numpy as np
    if bfloat16:
        # Reinterpret the raw bits (int16 has the same size; no copy beyond the usual).
        return _to_torch(name, array.view(np.int16), copy).view(torch.bfloat16)
    if _needs_widening(array):
        # torch 1.x has no uint16/uint32 tensors: widen (a copy even in zero-copy mode).
        return torch.from_numpy(array.astype(np.int32 if array.dtype == np.uint16 else np.int64))
    if copy:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        # The view is read-only on purpose (the slab is mapped PROT_READ); torch warns that
        # it cannot express that.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


_IMAGE_DTYPES = {"uint8": "UINT8", "float32": "FLOAT32", "float16": "FLOAT16",
                 "bfloat16": "BFLOAT16"}


def _current_cuda_ordinal(device):
    """torch.cuda.current_device(), for device='cuda' with no index (as torch reads it)."""
    try:
        import torch
    except ImportError:
        raise FerryError("FAILED_PRECONDITION", "device=%r yields torch CUDA tensors: install "
                         "PyTorch with CUDA, or use device='cpu'" % (device,)) from None
    if not torch.cuda.is_available():
        raise FerryError("FAILED_PRECONDITION", "device=%r: torch.cuda.is_available() is False "
                         "in this process (no GPU visible, or a CPU-only PyTorch); use "
                         "device='cpu'" % (device,))
    return torch.cuda.current_device()


def _parse_device(device):
    """'cpu' -> None; 'cuda:N' -> N (the trainer's ordinal); 'cuda' -> the current CUDA
    device, as in torch. torch.device objects are read the same way. TypeError/ValueError
    otherwise."""
    if type(device).__name__ == "device" and type(device).__module__ == "torch":
        kind, index = device.type, device.index
        if kind == "cpu":
            return None
        if kind == "cuda":
            return _current_cuda_ordinal(device) if index is None else int(index)
        raise ValueError("device must be 'cpu' or 'cuda[:N]', got %r" % (device,))
    if not isinstance(device, str):
        raise TypeError("device must be a str ('cpu', 'cuda' or 'cuda:N') or a torch.device, "
                        "got %r" % (device,))
    if device == "cpu":
        return None
    if device == "cuda":
        return _current_cuda_ordinal(device)
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError("device must be 'cpu' or 'cuda[:N]', got %r" % device)


def _launcher_rank():
    """(rank, world_size, where) of this process as the launcher set it up:
    torch.distributed's when it is initialized, else $RANK / $WORLD_SIZE (torchrun, SLURM
    wrappers and most launchers set both); None when neither says."""
    dist = sys.modules.get("torch.distributed")  # a process group implies torch is imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world), "$RANK/$WORLD_SIZE"
        except ValueError:
            raise ValueError("$RANK=%r and $WORLD_SIZE=%r must be integers (set by the "
                             "launcher); pass rank= and world_size= to ferry.Loader"
                             % (rank, world)) from None
    return None


def _resolve_rank(rank, world_size):
    """rank and world_size as given, else the launcher's (_launcher_rank), else 0 and 1. A
    value given that contradicts the launcher's is a ValueError naming both."""
    launcher = _launcher_rank()
    if launcher is None:
        return (0 if rank is None else rank), (1 if world_size is None else world_size)
    launcher_rank, launcher_world, where = launcher
    for name, given, theirs in (("rank", rank, launcher_rank),
                                ("world_size", world_size, launcher_world)):
        if given is not None and not isinstance(given, bool) and given != theirs:
            raise ValueError("%s=%r contradicts %s, which says rank %d of %d: leave rank= and "
                             "world_size= out to take the launcher's, or pass its values"
                             % (name, given, where, launcher_rank, launcher_world))
    return (launcher_rank if rank is None else rank,
            launcher_world if world_size is None else world_size)


def _warn_if_not_local_rank_device(device, cuda_ordinal):
    """Under torchrun ($LOCAL_RANK set), device='cuda' means the current device; one that is
    not LOCAL_RANK's usually means torch.cuda.set_device was not called, and every rank of
    the node would then train on GPU 0."""
    local = os.environ.get("LOCAL_RANK")
    if cuda_ordinal is None or local is None or not local.isdigit():
        return
    named = isinstance(device, str) and device.startswith("cuda:") or (
        type(device).__name__ == "device" and getattr(device, "index", None) is not None)
    if named or cuda_ordinal == int(local):
        return
    warnings.warn("ferry.Loader: device=%r is cuda:%d, the current CUDA device, but "
                  "$LOCAL_RANK is %s: call torch.cuda.set_device(local_rank) before making "
                  "the Loader (or pass device=\"cuda:%s\"), or every rank of this node uses "
                  "GPU %d" % (device, cuda_ordinal, local, local, cuda_ordinal),
                  RuntimeWarning, stacklevel=3)


def _check_channels(name, value):
    if value is None:
        return None
    if (not isinstance(value, (tuple, list)) or len(value) != 3 or
            not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)):
        raise TypeError("%s must be 3 numbers (R, G, B), got %r" % (name, value))
    out = [float(v) for v in value]
    if not all(math.isfinite(v) for v in out):
        raise ValueError("%s must be finite, got %r" % (name, value))
    return out


def _image_output(dataset, cuda_ordinal, image_dtype, mean, std):
    """The JobSpec's image_output dict (None for plain uint8), after checking the arguments."""
    if not isinstance(image_dtype, str) or image_dtype not in _IMAGE_DTYPES:
        raise ValueError("image_dtype must be one of %s, got %r"
                         % (sorted(_IMAGE_DTYPES), image_dtype))
    mean = _check_channels("mean", mean)
    std = _check_channels("std", std)
    if std is not None and not all(v > 0 for v in std):
        raise ValueError("std must be > 0 per channel, got %r" % (std,))
    if image_dtype == "uint8":
        if mean is not None or std is not None:
            raise ValueError("mean/std apply to normalized images: pass image_dtype='float32', "
                             "'float16' or 'bfloat16' with them")
        return None
    if not getattr(dataset, "_IMAGES", False):
        raise ValueError("image_dtype=%r applies to image datasets only" % image_dtype)
    if cuda_ordinal is None:
        raise ValueError("image_dtype=%r needs device='cuda:N': ferryd normalizes on the "
                         "GPU; on the CPU convert the uint8 batch yourself" % image_dtype)
    out = {"dtype": _IMAGE_DTYPES[image_dtype]}
    if mean is not None:
        out["mean"] = mean
    if std is not None:
        out["std"] = std
    return out


def _torch_cuda_device(ordinal):
    """torch.device('cuda', ordinal) after checking torch can use it."""
    try:
        import torch
    except ImportError:
        raise FerryError("FAILED_PRECONDITION", "device='cuda:%d' yields torch CUDA tensors: "
                         "install PyTorch with CUDA, or use device='cpu'" % ordinal) from None
    if not torch.cuda.is_available():
        raise FerryError("FAILED_PRECONDITION", "device='cuda:%d': torch.cuda.is_available() "
                         "is False in this process (no GPU visible, or a CPU-only PyTorch); "
                         "use device='cpu'" % ordinal)
    if ordinal >= torch.cuda.device_count():
        raise FerryError("INVALID_ARGUMENT", "device='cuda:%d': this process sees %d CUDA "
                         "device(s) (CUDA_VISIBLE_DEVICES=%s)"
                         % (ordinal, torch.cuda.device_count(),
                            os.environ.get("CUDA_VISIBLE_DEVICES", "unset")))
    return torch.device("cuda", ordinal)


def _torch_available():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def _job_spec(dataset, batch_size, transform, shuffle, seed, drop_last, world_size, prefetch,
              image_output, device="cpu"):
    """The ferry.v1.JobSpec (JSON dict) of checked Loader arguments."""
    spec = {
        "dataset": dataset._spec(),
        "batch_size": batch_size,
        "shuffle": _check_bool("shuffle", shuffle),
        "seed": str(seed),
        "drop_last": _check_bool("drop_last", drop_last),
        "world_size": world_size,
        "device": device,
        "prefetch_depth": _check_int("prefetch", prefetch, 0, _job_limit("prefetch_depth")),
    }
    if transform is not None and getattr(dataset, "_IMAGES", False):
        spec["transform"] = transform._spec()
    if image_output is not None:
        spec["image_output"] = image_output
    return spec


# torch DataLoader arguments that ferry.Loader does not take, with what does their job here.
_DATALOADER_ONLY = {
    "num_workers": "ferryd's worker threads decode for every rank of the machine: set "
                   "workers_per_node in ferryd.conf (or ferryd --workers N)",
    "pin_memory": "batches are already in pinned memory; device=\"cuda\" delivers them on "
                  "the GPU",
    "pin_memory_device": "use device=\"cuda:N\"",
    "prefetch_factor": "use prefetch=N (batches in flight for this rank)",
    "persistent_workers": "ferryd's workers persist across epochs; leave it out",
    "sampler": "the sampler runs in ferryd: use shuffle=, seed=, rank= and world_size=",
    "batch_sampler": "use batch_size= and drop_last=",
    "collate_fn": "batches arrive collated, as a dict of tensors",
    "worker_init_fn": "ferryd's workers run no Python; transforms go in transform=",
    "multiprocessing_context": "ferryd's workers are threads of the daemon; leave it out",
    "generator": "use seed= (every random draw follows from seed, epoch and sample)",
    "in_order": "batches always arrive in the sampler's order; leave it out",
    "snapshot_every_n_steps": "state_dict() may be called after any batch",
}


def _refuse_dataloader_arguments(kwargs):
    for name in kwargs:
        if name in _DATALOADER_ONLY:
            raise TypeError("Loader() takes no %s= (a torch DataLoader argument): %s"
                            % (name, _DATALOADER_ONLY[name]))
    if kwargs:
        raise TypeError("Loader() got an unexpected keyword argument %r"
                        % (sorted(kwargs)[0],))


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
        closed or is garbage is taken over (ferryd sees that Loader's stream end a moment
        later: wait for it); one held by an open Loader of this process, or by another
        process, is refused with what to do."""
        deadline = time.monotonic() + _TAKEOVER_SECONDS
        collected = False
        while True:
            try:
                return self._client.attach(self.job["id"], self.rank, self._attach_device)
            except FerryError as e:
                if e.reason != "RANK_HELD":
                    raise
                refusal = e
            if not collected:
                gc.collect()  # a Loader that is garbage but not collected yet closes now
                collected = True
            name = self._job_name or self.job.get("name")
            if self._rank_holder() is not None:
                raise FerryError("FAILED_PRECONDITION", "rank %d of job %r (%s) is held by "
                                 "another ferry.Loader of this process, which is still open: "
                                 "close it (loader.close()) or delete it, then create this one "
                                 "(a notebook cell run again: call close() on the old Loader "
                                 "first)" % (self.rank, name, self.job.get("id")),
                                 refusal.code_value, refusal.reason)
            if time.monotonic() > deadline:
                pid = self._consumer_pid()
                raise FerryError("FAILED_PRECONDITION", "rank %d of job %r (%s) is being "
                                 "consumed by %s; a rank has one consumer at a time: stop that "
                                 "process, or use another rank or job_name"
                                 % (self.rank, name, self.job.get("id"),
                                    "process %d" % pid if pid else "another process"),
                                 refusal.code_value, refusal.reason)
            time.sleep(0.05)

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
        from ferry.client import Client
        if address is None and os.environ.get("FERRY_ADDRESS"):
            address = os.environ["FERRY_ADDRESS"]
        self._address = address  # what a reattach connects to (None: the default daemon)
        if address is not None:
            self._client = Client(address)
            return
        try:
            self._client = Client(None)
            return
        except FerryError as e:
            if e.code not in ("NOT_FOUND", "UNAVAILABLE"):
                raise
        self._client = self._on_demand_client()

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
        "cpu_images", "fallbacks", "gpu_share"; docs/operations.md)."""
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
        if self._consumer is None:
            # An earlier reattach gave up (ferryd was gone for too long): try again now.
            self._reattach(FerryError("UNAVAILABLE", "not attached: the last attempt to "
                                      "reattach to ferryd gave up"))
            return self._iterate(self._generation)
        try:
            self._wrap(self._start_epoch, first)
        except FerryError as e:
            if e.code != "UNAVAILABLE":
                raise
            self._reattach(e)  # starts the epoch at `first` on the new daemon
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
        """Releases the batch the caller had; a batch of a consumer that is gone (ferryd
        restarted, see _reattach) has nothing to give back."""
        if held_by is not self._consumer:
            return
        try:
            self._release(held)
        except FerryError as e:
            if e.code != "UNAVAILABLE":
                raise  # else _next_batch meets the same break and reattaches

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
                return self._wrap(self._consumer.next, _POLL_MS)
            except FerryError as e:
                if e.code == "UNAVAILABLE":
                    self._reattach(e)  # ferryd restarted: continue where this epoch was
                    continue
                if e.code != "DEADLINE_EXCEEDED" or "no batch from ferryd" not in e.message:
                    raise
            waited += _POLL_MS / 1000.0
            if self._timeout is not None and waited >= self._timeout:
                raise FerryError("DEADLINE_EXCEEDED", "no batch from ferryd within %g s "
                                 "(epoch %d, after batch %d)"
                                 % (self._timeout, self._epoch, self._batches_done))

    def _reattach(self, error):
        """The daemon this Loader uses went away (restarted by systemd, upgraded): connects
        again, creates the same job and goes on with this epoch after the batches already
        delivered. The epoch's order is a function of (seed, epoch), so no sample is lost or
        repeated. An on-demand daemon (see ferry._daemon) is started again. Gives up after
        _REATTACH_SECONDS, raising `error`."""
        print("ferry: lost ferryd (%s); reattaching job %r rank %d at epoch %d batch %d"
              % (error.message, self._job_name or self.job.get("name"), self.rank, self._epoch,
                 self._batches_done), file=sys.stderr)
        self._finalizer.detach()
        Loader._cleanup_quietly(self._consumer, self._client)
        self._consumer = self._client = None
        self._view_cache.clear()  # views of the old slots
        patience = _reattach_seconds()
        deadline = time.monotonic() + patience
        from ferry.client import Client
        while True:
            try:
                if self._daemon is not None:  # ours is on demand: start it again if it died
                    self._client = self._on_demand_client()
                else:
                    self._client = Client(self._address)
                self.job = self._client.create_job(self._spec, name=self._job_name)
                if self._known_bad:
                    self._client.quarantine(self.job["id"], self._known_bad)
                self._consumer = self._client.attach(self.job["id"], self.rank,
                                                     self._attach_device)
                self._start_epoch(self._batches_done)
                break
            except FerryError as e:
                Loader._cleanup_quietly(self._consumer, self._client)
                self._consumer = self._client = None
                if (e.code not in ("NOT_FOUND", "UNAVAILABLE", "RESOURCE_EXHAUSTED") or
                        time.monotonic() > deadline):
                    self._finalizer = weakref.finalize(self, lambda: None)
                    raise FerryError(error.code, "%s; ferryd did not take the job back within "
                                     "%g s: %s" % (error.message, patience, e.message),
                                     error.code_value) from e
                time.sleep(0.2)
        self._finalizer = weakref.finalize(self, Loader._cleanup, self._consumer, self._client,
                                           self._daemon)

    @staticmethod
    def _cleanup_quietly(consumer, client):
        for closable in (consumer, client):
            if closable is not None:
                try:
                    closable.close()
                except FerryError:
                    pass

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


def _check_path_like(name, value):
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError("%s must be a socket path (str or os.PathLike), got %r" % (name, value))
    return value
