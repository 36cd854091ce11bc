"""The dataset kinds a ferry.Loader reads (docs/data.md, "Dataset kinds"): each checks its
arguments and gives the dataset part of the job spec."""

import numbers
import os

from ferry._checks import _check_bool, _check_int, _check_path, _is_remote


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
    if _is_remote(pattern):
        return pattern
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
    "index": int64[B]}.

    shard_index (instead of `shards`): a WebDataset shard index, the JSON that `widsindex
    create` writes ({"shardlist": [{"url", "nsamples"}, ...]}), as a path or an s3:// or
    https:// location. ferryd reads the shards and their sample counts from it, so a job
    starts without reading every shard first and a first epoch over a store overlaps the
    download of its later shards. With it, a sample without an image member is a bad sample
    (quarantined), and a shard whose sample count differs from the index stops the job."""

    _IMAGES = True

    def __init__(self, shards=None, image_key="jpg", label_key="cls", shuffle_buffer=1000,
                 exif_orientation=False, shard_index=None):
        if (shards is None) == (shard_index is None):
            raise TypeError("WebDataset takes shards or shard_index (one of them), got %s"
                            % ("both" if shards is not None else "neither"))
        self.shard_index = None
        if shard_index is not None:
            self.shard_index = _check_path("WebDataset shard_index", shard_index)
            shards = []
        elif isinstance(shards, (str, os.PathLike)):
            shards = [shards]
        if not isinstance(shards, (list, tuple)) or (not shards and shard_index is None):
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
        spec = {"image_key": self.image_key, "label_key": self.label_key,
                "shuffle_buffer": self.shuffle_buffer}
        if self.shard_index is not None:
            spec["shard_index"] = self.shard_index
        else:
            spec["shards"] = list(self.shards)
        if self.exif_orientation:  # as ImageFolder's
            spec["exif_orientation"] = True
        return {"webdataset": spec}

    def __repr__(self):
        where = ("shard_index=%r" % self.shard_index if self.shard_index is not None else
                 repr(self.shards if len(self.shards) != 1 else self.shards[0]))
        return "WebDataset(%s, image_key=%r, label_key=%r, shuffle_buffer=%d%s)" % (
            where, self.image_key,
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


class MegatronGPT:
    """Megatron-Core's GPTDataset (one path prefix) or BlendedDataset (several, with
    `weights`) over Megatron-LM indexed datasets (.bin/.idx), for one split: sample i is
    sample i of the dataset Megatron-Core's BlendedMegatronDatasetBuilder builds from the same
    files, split string, random_seed, sequence_length, blend and num_samples, field for
    field (docs/data.md, "Megatron-Core's samples"). Arguments are GPTDatasetConfig's:
    split "969, 30, 1" and random_seed 1234 are Megatron-LM's --split and --seed defaults;
    eod_token and pad_token are the tokenizer's (pad_token None: a tokenizer without one);
    num_samples is the split's size (train_iters * global_batch_size; None: one epoch of the
    corpus, one prefix only).

    The order is Megatron's own: use it with shuffle=False (the default), and batch_size is
    the micro-batch size: rank r gets micro-batch r of each global batch of world_size *
    batch_size samples, as Megatron's MegatronPretrainingSampler deals them (drop_last=True
    drops the short last global batch, as Megatron does). Batches: "tokens", "labels",
    "position_ids" (output_dtype[B, S]), "loss_mask" (float32[B, S]), with
    create_attention_mask=True "attention_mask" (bool[B, 1, S, S], True where masked), with
    cu_seqlens=True "cu_seqlens" (int32[B, S + 1]) and "num_seqs" (int32[B]): the segments
    reset_attention_mask makes (a new one after each EOD), and "index" (int64[B])."""

    _SPLITS = {"train": "TRAIN", "valid": "VALID", "test": "TEST"}

    def __init__(self, path_prefixes, sequence_length, eod_token, weights=None,
                 split="969, 30, 1", split_name="train", num_samples=None, random_seed=1234,
                 pad_token=None, reset_position_ids=False, reset_attention_mask=False,
                 eod_mask_loss=False, create_attention_mask=False,
                 add_extra_token_to_sequence=True, drop_last_partial_validation_sequence=True,
                 mid_level_dataset_surplus=0.005, cu_seqlens=False, output_dtype="int64"):
        if isinstance(path_prefixes, (str, os.PathLike)):
            path_prefixes = [path_prefixes]
        if not isinstance(path_prefixes, (list, tuple)) or not path_prefixes:
            raise TypeError("MegatronGPT path_prefixes must be a path or a non-empty list of "
                            "paths, got %r" % (path_prefixes,))
        self.path_prefixes = []
        for i, prefix in enumerate(path_prefixes):
            prefix = _check_path("MegatronGPT path_prefixes[%d]" % i, prefix)
            for ext in (".bin", ".idx"):
                if prefix.endswith(ext):
                    raise ValueError("MegatronGPT path_prefixes[%d] is the path without %s, "
                                     "got %r" % (i, ext, prefix))
            self.path_prefixes.append(prefix)
        if weights is None:
            if len(self.path_prefixes) > 1:
                raise ValueError("MegatronGPT with %d path_prefixes needs one weight each "
                                 "(Megatron's blend)" % len(self.path_prefixes))
            self.weights = []
        else:
            weights = list(weights)
            if len(weights) != len(self.path_prefixes):
                raise ValueError("MegatronGPT weights has %d entries for %d path_prefixes"
                                 % (len(weights), len(self.path_prefixes)))
            for i, w in enumerate(weights):
                if isinstance(w, bool) or not isinstance(w, numbers.Real) or not w > 0:
                    raise ValueError("MegatronGPT weights[%d] must be a number > 0, got %r"
                                     % (i, w))
            self.weights = [float(w) for w in weights]
        self.sequence_length = _check_int("sequence_length", sequence_length, 2, 2**20)
        self.eod_token = _check_int("eod_token", eod_token)
        if not isinstance(split, str) or not split.strip():
            raise TypeError("MegatronGPT split must be a string like \"969, 30, 1\", got %r"
                            % (split,))
        self.split = split
        if split_name not in self._SPLITS:
            raise ValueError("MegatronGPT split_name must be one of %s, got %r"
                             % (sorted(self._SPLITS), split_name))
        self.split_name = split_name
        if num_samples is None:
            if self.weights:
                raise ValueError("MegatronGPT num_samples must be given for a blend (weights): "
                                 "Megatron's builder shares that size out by weight")
            self.num_samples = None
        else:
            self.num_samples = _check_int("num_samples", num_samples, 1, 2**57)
        self.random_seed = _check_int("random_seed", random_seed, 0, 2**32 - 1)
        self.pad_token = None if pad_token is None else _check_int("pad_token", pad_token)
        self.reset_position_ids = _check_bool("reset_position_ids", reset_position_ids)
        self.reset_attention_mask = _check_bool("reset_attention_mask", reset_attention_mask)
        self.eod_mask_loss = _check_bool("eod_mask_loss", eod_mask_loss)
        self.create_attention_mask = _check_bool("create_attention_mask", create_attention_mask)
        self.add_extra_token_to_sequence = _check_bool("add_extra_token_to_sequence",
                                                       add_extra_token_to_sequence)
        self.drop_last_partial_validation_sequence = _check_bool(
            "drop_last_partial_validation_sequence", drop_last_partial_validation_sequence)
        if (isinstance(mid_level_dataset_surplus, bool)
                or not isinstance(mid_level_dataset_surplus, numbers.Real)
                or not mid_level_dataset_surplus >= 0):
            raise ValueError("MegatronGPT mid_level_dataset_surplus must be a number >= 0, got "
                             "%r" % (mid_level_dataset_surplus,))
        self.mid_level_dataset_surplus = float(mid_level_dataset_surplus)
        self.cu_seqlens = _check_bool("cu_seqlens", cu_seqlens)
        if output_dtype not in Tokens._OUTPUT_DTYPES:
            raise ValueError("MegatronGPT output_dtype must be one of %s, got %r"
                             % (sorted(Tokens._OUTPUT_DTYPES), output_dtype))
        self.output_dtype = output_dtype

    def _spec(self):
        spec = {"path_prefixes": self.path_prefixes, "sequence_length": self.sequence_length,
                "split": self.split, "split_name": self._SPLITS[self.split_name],
                "random_seed": self.random_seed, "eod_token": self.eod_token,
                "mid_level_dataset_surplus": self.mid_level_dataset_surplus,
                "output_dtype": Tokens._OUTPUT_DTYPES[self.output_dtype]}
        if self.weights:
            spec["weights"] = self.weights
        if self.num_samples is not None:
            spec["num_samples"] = self.num_samples
        if self.pad_token is not None:
            spec["pad_token"] = self.pad_token
        for flag in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss",
                     "create_attention_mask", "cu_seqlens"):
            if getattr(self, flag):
                spec[flag] = True
        if not self.add_extra_token_to_sequence:
            spec["no_extra_token"] = True
        if not self.drop_last_partial_validation_sequence:
            spec["keep_partial_validation_sequence"] = True
        return {"megatron_gpt": spec}

    def __repr__(self):
        return "MegatronGPT(%r, sequence_length=%d, split=%r, split_name=%r, num_samples=%r)" % (
            self.path_prefixes if len(self.path_prefixes) > 1 else self.path_prefixes[0],
            self.sequence_length, self.split, self.split_name, self.num_samples)


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
