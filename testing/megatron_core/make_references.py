#!/usr/bin/env python3
"""Reference outputs for ferry's Megatron-compatible loading, produced by Megatron-Core's OWN
dataset code (not a re-implementation).

Given an extracted Megatron-LM source tree (--megatron, the directory holding megatron/core), this
script:
  * compiles megatron/core/datasets/helpers.cpp with Megatron's own Makefile into a temp dir;
  * imports megatron.core.datasets.* from that tree with a few import-time shims (see README.md,
    install_shims below): no dataset logic is replaced;
  * writes small corpora with Megatron's IndexedDatasetBuilder (<out>/corpora/*.bin/.idx);
  * for each named case builds the datasets through BlendedMegatronDatasetBuilder (blend + split
    string, as pretrain_gpt.py does) and records every sample __getitem__ yields, plus the
    GPTDataset document/sample/shuffle indices and the BlendedDataset dataset(_sample)_index;
  * writes <out>/<case>.npz (byte-reproducible zip) and <out>/manifest.json.

Run with a Python that has numpy, torch and pybind11 (Debian: /usr/bin/python3 with python3-numpy,
python3-torch, python3-pybind11, python3-dev). See README.md for the exact command.
"""

import argparse
import collections
import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import zipfile

import numpy

# Megatron files whose code produces the references; their sha256 go into the manifest.
MEGATRON_FILES = [
    "megatron/core/datasets/gpt_dataset.py",
    "megatron/core/datasets/blended_dataset.py",
    "megatron/core/datasets/blended_megatron_dataset_builder.py",
    "megatron/core/datasets/blended_megatron_dataset_config.py",
    "megatron/core/datasets/indexed_dataset.py",
    "megatron/core/datasets/megatron_dataset.py",
    "megatron/core/datasets/utils.py",
    "megatron/core/datasets/helpers.cpp",
    "megatron/core/datasets/helpers.py",
    "megatron/core/datasets/Makefile",
    "megatron/core/utils.py",
    "megatron/core/_rank_utils.py",
]

SEQ_LEN = 8
SEED = 1234
# The tokenizer every uint16 case uses (vocab < 65500, so DType.optimal_dtype -> uint16) and the
# one the int32 case uses (vocab > 65536 -> int32). pad != eod, so MegatronDataset keeps pad as-is.
TOK_SMALL = dict(vocab_size=1000, eod=2, pad=1)
TOK_LARGE = dict(vocab_size=100000, eod=2, pad=1)
FIRST_TOKEN = 3  # ordinary tokens are drawn from [FIRST_TOKEN, vocab): never eod or pad

M = types.SimpleNamespace()  # the imported Megatron modules
BUILD_COMMANDS = {}  # helpers build variant -> the compiler command make ran


# --------------------------------------------------------------------------------------------
# Megatron setup: helpers.cpp via its Makefile, then the import shims
# --------------------------------------------------------------------------------------------


def compile_helpers(megatron_root, workdir, variant="makefile"):
    """Runs Megatron's own Makefile on a copy of helpers.cpp; returns the directory of the .so.

    The Makefile calls `python3 -m pybind11 --includes` and `python3-config --extension-suffix`;
    a PATH entry makes those resolve to this interpreter (and its -config) so that the module is
    built for the Python that imports it. variant "makefile" is the Makefile as is (asserts on);
    variant "ndebug" adds CPPFLAGS=-DNDEBUG (the Makefile appends to it), which is what a
    setuptools build of Megatron's setup.py gets from Python's CFLAGS: asserts compiled out."""
    src = os.path.join(megatron_root, "megatron", "core", "datasets")
    build = os.path.join(workdir, "helpers_build_" + variant)
    os.makedirs(build)
    for name in ("Makefile", "helpers.cpp"):
        shutil.copy2(os.path.join(src, name), build)
    bindir = os.path.join(workdir, "bin")
    if not os.path.isdir(bindir):
        os.makedirs(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "python3"))
        config = os.path.realpath(sys.executable) + "-config"
        if not os.path.exists(config):
            config = sys.executable + "-config"
        if not os.path.exists(config):
            sys.exit(f"no python3-config next to {sys.executable} (install python3-dev)")
        os.symlink(config, os.path.join(bindir, "python3-config"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("CPPFLAGS", None)
    env.pop("CXXFLAGS", None)
    if variant == "ndebug":
        env["CPPFLAGS"] = "-DNDEBUG"
    else:
        assert variant == "makefile", variant
    proc = subprocess.run(["make", "-C", build], env=env, check=True, capture_output=True,
                          text=True)
    lines = [l for l in proc.stdout.splitlines() if "helpers.cpp" in l and not l.startswith("make")]
    BUILD_COMMANDS[variant] = dict(
        env_CPPFLAGS=env.get("CPPFLAGS"),
        command=[l.replace(workdir, "<tmp>") for l in lines])
    return build


def install_shims(megatron_root, helpers_dir):
    """Import-time shims only. See README.md for why each is needed.

    1. `megatron` and `megatron.core` are registered as bare packages pointing at the source
       tree, so their __init__.py (which imports the whole model stack: tensor_parallel,
       distributed, dist_checkpointing -> torch.distributed.checkpoint, absent in torch 1.13)
       is not executed. Every submodule below is still loaded from Megatron's own files.
    2. `megatron.core.parallel_state`: empty module. megatron/core/utils.py imports it at module
       level; the dataset code never calls it.
    3. `megatron.core.dist_checkpointing(.mapping)`: a package with a placeholder ShardedTensor
       class. megatron/core/utils.py imports `ShardedTensor` at module level for type checks of
       checkpoint code; the dataset code never uses it.
    4. `megatron.core.safe_globals`: a module whose safe_numpy_load raises. The real module
       imports numpy.dtypes (numpy >= 1.25) and the optimizer/transformer stack. The dataset code
       calls safe_numpy_load only to load an existing index cache; every case here builds into a
       fresh path_to_cache, so it is never called (it would raise if it were).
    5. helpers_cpp: the directory holding the freshly compiled helpers_cpp*.so is appended to
       megatron.core.datasets.__path__, so `from megatron.core.datasets.helpers_cpp import *`
       (in Megatron's helpers.py) finds it without writing into the source tree.
    """

    def module(name, path=None):
        m = types.ModuleType(name)
        if path is not None:
            m.__path__ = [path]
        sys.modules[name] = m
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, m)
        return m

    # single process: rank 0 of 1 (only used by Megatron's log_single_rank / safe_get_rank)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")

    module("megatron", os.path.join(megatron_root, "megatron"))
    module("megatron.core", os.path.join(megatron_root, "megatron", "core"))
    module("megatron.core.parallel_state")
    module("megatron.core.dist_checkpointing", os.path.join(megatron_root, "__no_such_dir__"))
    mapping = module("megatron.core.dist_checkpointing.mapping")

    class ShardedTensor:  # placeholder; never instantiated by the dataset code
        pass

    mapping.ShardedTensor = ShardedTensor
    safe_globals = module("megatron.core.safe_globals")

    def safe_numpy_load(*args, **kwargs):
        raise RuntimeError("shim: safe_numpy_load (index cache hit) is not expected here")

    safe_globals.safe_numpy_load = safe_numpy_load

    import megatron.core.datasets as datasets_pkg

    datasets_pkg.__path__.append(helpers_dir)

    from megatron.core.datasets import (
        blended_dataset,
        blended_megatron_dataset_builder,
        blended_megatron_dataset_config,
        gpt_dataset,
        helpers,
        indexed_dataset,
        megatron_dataset,
        utils,
    )

    M.gpt = gpt_dataset
    M.blended = blended_dataset
    M.builder = blended_megatron_dataset_builder
    M.config = blended_megatron_dataset_config
    M.indexed = indexed_dataset
    M.megatron_dataset = megatron_dataset
    M.utils = utils
    M.helpers = helpers
    root = os.path.realpath(megatron_root)
    for mod in (gpt_dataset, blended_dataset, blended_megatron_dataset_builder,
                blended_megatron_dataset_config, indexed_dataset, megatron_dataset, helpers, utils):
        assert os.path.realpath(mod.__file__).startswith(root + os.sep), mod.__file__
    helpers_cpp = sys.modules["megatron.core.datasets.helpers_cpp"]
    assert os.path.dirname(os.path.realpath(helpers_cpp.__file__)) == os.path.realpath(helpers_dir)


class RefTokenizer:
    """Tiny tokenizer object: only what GPTDatasetConfig / MegatronDataset / GPTDataset read
    (vocab_size, eod, pad, and unique_identifiers for the dataset description hash)."""

    def __init__(self, vocab_size, eod, pad):
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = pad

    @property
    def unique_identifiers(self):
        return collections.OrderedDict(
            [("class", "RefTokenizer"), ("vocab_size", self.vocab_size), ("eod", self.eod),
             ("pad", self.pad)]
        )


# --------------------------------------------------------------------------------------------
# Corpora (written with Megatron's IndexedDatasetBuilder)
# --------------------------------------------------------------------------------------------


def _doc(rng, n_content, lo=FIRST_TOKEN, hi=TOK_SMALL["vocab_size"], eod=True):
    toks = [int(t) for t in rng.randint(lo, hi, size=n_content)]
    return toks + ([TOK_SMALL["eod"]] if eod else [])


def corpus_specs():
    """name -> (tokenizer kwargs, writer, documents). A document is a list of sequences; a
    sequence is a list of token ids. writer: 'add_document' = builder.add_document(doc, lens) per
    document, as tools/preprocess_data.py does; 'add_item' = builder.add_item(seq) per sequence
    then builder.end_document()."""
    eod, pad = TOK_SMALL["eod"], TOK_SMALL["pad"]
    specs = {}

    # a: one sequence per document, each ending with EOD (preprocess_data.py --append-eod)
    rng = numpy.random.RandomState(1)
    specs["one_seq_per_doc"] = (
        TOK_SMALL, "add_document", [[_doc(rng, int(rng.randint(1, 12)))] for _ in range(12)])

    # b: several sequences ("sentences") per document; EOD only on the last sentence, as
    # preprocess_data.py --split-sentences --append-eod writes them
    rng = numpy.random.RandomState(2)
    docs = []
    for _ in range(8):
        sents = [_doc(rng, int(rng.randint(1, 7)), eod=False) for _ in range(int(rng.randint(2, 5)))]
        sents[-1].append(eod)
        docs.append(sents)
    specs["multi_seq_per_doc"] = (TOK_SMALL, "add_item", docs)

    # c: empty documents / sequences and 1-token documents mixed in; a few pad ids in the data
    rng = numpy.random.RandomState(3)
    docs = [
        [_doc(rng, 4)],
        [],                                   # document with zero sequences
        [[eod]],                              # 1-token document: EOD only
        [_doc(rng, 1, eod=False) + [pad] + _doc(rng, 2)],  # pad id mid-document
        [[]],                                 # document with one empty (0-token) sequence
        [[int(rng.randint(FIRST_TOKEN, 1000))]],      # 1-token document without EOD
        [_doc(rng, 8)],
        [[eod]],
        [[], _doc(rng, 3)],                   # empty first sentence, then a sentence with EOD
        [_doc(rng, 5, eod=False) + [pad, eod]],  # pad id right before EOD
        [[]],
        [[int(rng.randint(FIRST_TOKEN, 1000))]],
        [_doc(rng, 6)],
        [],
        [[eod]],
        [_doc(rng, 1)],                       # 2 tokens: one + EOD
    ]
    specs["edge_docs"] = (TOK_SMALL, "add_document", docs)

    # f: 600 short one-sequence documents, so that "969,30,1" gives a non-empty test split
    # (round(0.999 * 600) = 599 -> test = sequence 599 only); the last one is long enough
    rng = numpy.random.RandomState(4)
    docs = [[_doc(rng, int(rng.randint(0, 6)))] for _ in range(599)] + [[_doc(rng, 9)]]
    specs["split_600"] = (TOK_SMALL, "add_document", docs)

    # g: 9 blend sources; source k draws its tokens from [100k+3, 100k+100) so it is visible
    for k in range(9):
        rng = numpy.random.RandomState(100 + k)
        docs = [[_doc(rng, int(rng.randint(1, 10)), lo=100 * k + 3, hi=100 * k + 100)]
                for _ in range(20)]
        specs[f"blend_src{k}"] = (TOK_SMALL, "add_document", docs)

    # int32 corpus: vocab 100000, tokens on both sides of 65535
    rng = numpy.random.RandomState(5)
    docs = [[[int(t) for t in rng.randint(FIRST_TOKEN, TOK_LARGE["vocab_size"],
                                          size=int(rng.randint(1, 10)))] + [eod]]
            for _ in range(10)]
    docs[0][0][:3] = [65535, 65536, 99999]
    specs["int32_corpus"] = (TOK_LARGE, "add_document", docs)
    return specs


def write_corpus(prefix, tok, writer, docs):
    import torch

    dtype = M.indexed.DType.optimal_dtype(tok["vocab_size"])  # as preprocess_data.py
    builder = M.indexed.IndexedDatasetBuilder(M.indexed.get_bin_path(prefix), dtype=dtype)
    for doc in docs:
        if writer == "add_document":
            flat = [t for seq in doc for t in seq]
            builder.add_document(torch.tensor(flat, dtype=torch.int64), [len(s) for s in doc])
        else:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
    builder.finalize(M.indexed.get_idx_path(prefix))
    ds = M.indexed.IndexedDataset(prefix)  # read back with Megatron's reader
    return dict(
        dtype=numpy.dtype(dtype).name,
        tokenizer=tok,
        writer=writer,
        num_sequences=int(len(ds)),
        num_documents=int(ds.document_indices.shape[0] - 1),
        num_tokens=int(ds.sequence_lengths.sum()),
        sequence_lengths=[int(x) for x in ds.sequence_lengths],
        document_indices=[int(x) for x in ds.document_indices],
    )


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


def cases():
    """name -> spec. 'num_samples' may be a callable of tokens_per_epoch (the train split's token
    count, from the corpus) so that the epoch count the case wants is hit; the chosen value and
    Megatron's own num_epochs are both recorded."""
    per_epoch = lambda T, extra=1: (T - extra) // SEQ_LEN  # noqa: E731
    return collections.OrderedDict([
        ("a_one_seq_per_doc", dict(
            corpus=["one_seq_per_doc"], split="1,0,0",
            # the most samples that fit in exactly 2 epochs -> num_epochs 2, no separate epoch
            num_samples=lambda T: (2 * T - 1) // SEQ_LEN,
            doc="one EOD-terminated sequence per document, 2 full epochs, default options")),
        ("b_multi_seq_per_doc", dict(
            corpus=["multi_seq_per_doc"], split="1,0,0",
            # ~1.3 epochs -> num_epochs 2, final epoch separated (below the 0.8 threshold)
            num_samples=lambda T: per_epoch(T) + (3 * per_epoch(T)) // 10,
            doc="several sequences per document (EOD on the last one); GPT splits/indexes by "
                "sequence, not by document")),
        ("c_empty_and_1tok_docs", dict(
            corpus=["edge_docs"], split="1,0,0",
            # 2.5 epochs -> num_epochs 3, separate final epoch
            num_samples=lambda T: (2 * T - 1) // SEQ_LEN + per_epoch(T) // 2,
            doc="zero-sequence documents, 0-token sequences, 1-token documents, pad ids in data")),
        ("d_reset_flags", dict(
            corpus=["multi_seq_per_doc"], split="1,0,0",
            options=dict(reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True),
            num_samples=lambda T: (2 * T - 1) // SEQ_LEN,
            doc="reset_position_ids, reset_attention_mask, eod_mask_loss on")),
        ("e_no_extra_token", dict(
            corpus=["one_seq_per_doc"], split="1,0,0",
            options=dict(add_extra_token_to_sequence=False),
            # one epoch and one sample -> num_epochs 2, separate final epoch
            num_samples=lambda T: T // SEQ_LEN + 1,
            doc="add_extra_token_to_sequence=False (labels[-1] is the pad id, then masked)")),
        ("f_split_969_30_1", dict(
            corpus=["split_600"], split="969,30,1", sizes=[48, 16, 8],
            doc="train/valid/test from one corpus with the split string 969,30,1")),
        ("g1_blend3", dict(
            corpus=["blend_src0", "blend_src1", "blend_src2"], weights=[0.7, 0.2, 0.1],
            split="90,10,0", sizes=[40, 8, 0],
            doc="blend of 3 sources, weights 0.7/0.2/0.1, train and valid splits")),
        ("g2_blend9", dict(
            corpus=[f"blend_src{k}" for k in range(9)],
            weights=[3.0, 1.5, 0.25, 7.0, 2.0, 0.5, 1.0, 4.75, 0.1], split="1,0,0",
            sizes=[64, 0, 0],
            doc="blend of 9 sources, unequal weights summing to 20.1")),
        ("h_seq_len_1", dict(
            corpus=["one_seq_per_doc"], split="1,0,0", sequence_length=1, sizes=[4, 0, 0],
            subprocess=True, doc="sequence_length 1, helpers built by the Makefile (asserts on)")),
        ("h2_seq_len_1_ndebug", dict(
            corpus=["one_seq_per_doc"], split="1,0,0", sequence_length=1, sizes=[4, 0, 0],
            subprocess=True, helpers="ndebug",
            doc="sequence_length 1, helpers built with -DNDEBUG as a setup.py/pip build is")),
        ("i_int32_corpus", dict(
            corpus=["int32_corpus"], split="1,0,0", tokenizer=TOK_LARGE,
            num_samples=lambda T: per_epoch(T), doc="int32 tokens (vocab 100000), one epoch")),
    ])


class LogCapture(logging.Handler):
    """Collects Megatron's own GPTDataset log records (num_epochs, separate_final_epoch, ...)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        if record.name == "megatron.core.datasets.gpt_dataset":
            self.records.append(record.getMessage())


def parse_gpt_build_logs(messages):
    """Groups Megatron's GPTDataset build log lines: one dict per 'Build and save the GPTDataset
    <split> indices' block, with the '> key: value' lines that follow it."""
    blocks = []
    for msg in messages:
        if msg.startswith("Build and save the GPTDataset"):
            blocks.append(collections.OrderedDict(split=msg.split()[-2]))
        elif blocks and msg.startswith("> ") and ":" in msg and "time elapsed" not in msg:
            key, _, value = msg[2:].partition(":")
            value = value.strip()
            for conv in (int, float):
                try:
                    value = conv(value)
                    break
                except ValueError:
                    pass
            else:
                value = {"True": True, "False": False}.get(value, value)
            blocks[-1][key.strip()] = value
    return blocks


def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, numpy.integer):
        return int(v)
    if isinstance(v, numpy.floating):
        return float(v)
    return v


def config_to_json(cfg, corpus_dir):
    out = collections.OrderedDict()
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == "tokenizer":
            v = dict(v.unique_identifiers)
        elif f.name == "blend" and v is not None:
            v = [[os.path.relpath(p, corpus_dir) for p in v[0]], v[1]]
        elif f.name == "path_to_cache":
            v = "<fresh empty temp dir>"
        out[f.name] = jsonable(v)
    return out


def stack_samples(dataset):
    cols = collections.defaultdict(list)
    for i in range(len(dataset)):
        for k, v in dataset[i].items():
            cols[k].append(v.numpy() if hasattr(v, "numpy") else numpy.asarray(v))
    return {k: numpy.stack(v) for k, v in cols.items()}


def gpt_info(ds, log_block):
    info = collections.OrderedDict()
    info["index_split"] = ds.index_split.name
    info["dataset_path"] = os.path.basename(ds.dataset_path)
    info["indexed_indices_range"] = (
        [int(ds.indices[0]), int(ds.indices[-1]) + 1] if len(ds.indices) else [0, 0])
    info["num_samples_requested"] = ds.num_samples
    info["len"] = len(ds)
    T = ds._get_num_tokens_per_epoch()  # Megatron's own methods
    info["num_tokens_per_epoch"] = T
    info["num_epochs"] = ds._get_num_epochs(T)
    info["megatron_build_log"] = log_block
    info["document_index_dtype"] = ds.document_index.dtype.name
    info["sample_index_dtype"] = ds.sample_index.dtype.name
    info["shuffle_index_dtype"] = ds.shuffle_index.dtype.name
    return info


def gpt_arrays(prefix, ds):
    return {f"{prefix}document_index": numpy.asarray(ds.document_index),
            f"{prefix}sample_index": numpy.asarray(ds.sample_index),
            f"{prefix}shuffle_index": numpy.asarray(ds.shuffle_index)}


def run_case(name, spec, corpus_dir, corpora, cache_root, progress=None):
    """Builds one case with Megatron's builder; returns (manifest entry, arrays)."""
    tok_kw = spec.get("tokenizer", TOK_SMALL)
    tokenizer = RefTokenizer(**tok_kw)
    prefixes = [os.path.join(corpus_dir, c) for c in spec["corpus"]]
    seq_len = spec.get("sequence_length", SEQ_LEN)
    options = dict(reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    options.update(spec.get("options", {}))

    if "sizes" in spec:
        sizes = list(spec["sizes"])
    else:
        tokens = corpora[spec["corpus"][0]]["num_tokens"]
        sizes = [spec["num_samples"](tokens), 0, 0]

    def say(msg):
        if progress:
            print(msg, file=progress, flush=True)

    cache = os.path.join(cache_root, name)
    assert not os.path.exists(cache)
    config = M.gpt.GPTDatasetConfig(
        random_seed=SEED,
        sequence_length=seq_len,
        blend=(prefixes, spec.get("weights")),
        split=spec["split"],
        path_to_cache=cache,
        tokenizer=tokenizer,
        **options,
    )
    say("GPTDatasetConfig constructed")
    builder = M.builder.BlendedMegatronDatasetBuilder(
        M.gpt.GPTDataset, sizes, lambda: True, config)
    say("BlendedMegatronDatasetBuilder constructed")

    capture = LogCapture()
    mlog = logging.getLogger("megatron")
    mlog.addHandler(capture)
    mlog.setLevel(logging.DEBUG)
    try:
        say("calling build()")
        splits = builder.build()
        say("build() returned")
    finally:
        mlog.removeHandler(capture)
    blocks = parse_gpt_build_logs(capture.records)

    entry = collections.OrderedDict()
    entry["description"] = spec["doc"]
    entry["corpora"] = spec["corpus"]
    entry["builder_sizes"] = sizes
    entry["config"] = config_to_json(config, corpus_dir)
    entry["split_matrix"] = jsonable(config.split_matrix)
    arrays = {}
    weights = spec.get("weights")

    # The GPTDatasets in the order Megatron built (and logged) them: per prefix, per split.
    if weights is None:
        gpt_in_order = [ds for ds in splits if ds is not None]
    else:
        gpt_in_order = [bd.datasets[p] for p in range(len(prefixes))
                        for bd in splits if bd is not None]
    assert len(blocks) == len(gpt_in_order), (len(blocks), len(gpt_in_order))
    for blk, ds in zip(blocks, gpt_in_order):
        assert blk["split"] == ds.index_split.name
        assert blk["total number of samples"] == len(ds)

    if weights is not None:
        normalized_once = M.utils.normalize(weights)  # what the builder passes on
        target = M.builder._get_size_per_split_per_dataset(normalized_once, sizes)
        buffer = M.builder._get_size_per_split_per_dataset(
            normalized_once, sizes, surplus=config.mid_level_dataset_surplus)
        entry["weights_input"] = weights
        entry["weights_after_builder_normalize"] = normalized_once
        entry["sizes_per_dataset_target"] = target
        entry["sizes_per_dataset_buffer"] = buffer

    entry["splits"] = collections.OrderedDict()
    for split_ds in splits:
        if split_ds is None:
            continue
        if weights is None:
            ds = split_ds
            sname = ds.index_split.name
            info = gpt_info(ds, blocks[gpt_in_order.index(ds)])
            arrays.update(gpt_arrays(f"{sname}/", ds))
        else:
            bd = split_ds
            sname = bd.split.name
            info = collections.OrderedDict()
            info["blended_size"] = bd.size
            info["len"] = len(bd)
            info["weights_final"] = list(bd.weights)
            info["weights_final_repr"] = [repr(float(w)) for w in bd.weights]
            counts = numpy.bincount(bd.dataset_index, minlength=len(bd.datasets))
            info["samples_drawn_per_dataset"] = [int(c) for c in counts]
            arrays[f"{sname}/weights_final"] = numpy.asarray(bd.weights, dtype=numpy.float64)
            arrays[f"{sname}/dataset_index"] = numpy.asarray(bd.dataset_index)
            arrays[f"{sname}/dataset_sample_index"] = numpy.asarray(bd.dataset_sample_index)
            info["datasets"] = []
            for k, ds in enumerate(bd.datasets):
                info["datasets"].append(gpt_info(ds, blocks[gpt_in_order.index(ds)]))
                arrays.update(gpt_arrays(f"{sname}/ds{k}/", ds))
            ds = bd
        samples = stack_samples(ds)
        info["num_samples_stored"] = int(samples["tokens"].shape[0])
        info["sample_keys"] = {k: [v.dtype.name, list(v.shape)] for k, v in samples.items()}
        for k, v in samples.items():
            arrays[f"{sname}/{k}"] = v
        entry["splits"][sname] = info
    return entry, arrays


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def save_npz(path, arrays):
    """numpy.load-compatible .npz with fixed timestamps and key order (byte-reproducible)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for key in sorted(arrays):
            zi = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            buf = io.BytesIO()
            numpy.lib.format.write_array(buf, numpy.ascontiguousarray(arrays[key]),
                                         allow_pickle=False)
            zf.writestr(zi, buf.getvalue(), compresslevel=9)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def megatron_commit(root, given):
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sys.exit("--megatron is not a git checkout: pass --megatron-commit")


def run_child_case(args, name, workdir, helpers_dir):
    """Runs one case in a child process (Megatron's C++ asserts abort the process). Returns
    (outcome, entry, arrays); entry and arrays are None unless the child completed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--megatron", args.megatron, "--out",
           args.out, "--_child-case", name, "--_helpers-dir", helpers_dir, "--_workdir", workdir]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    clean = lambda s: s.replace(workdir, "<tmp>").replace(  # noqa: E731
        os.path.abspath(args.out), "<out>").replace(os.path.abspath(args.megatron), "<megatron>")
    result = collections.OrderedDict()
    result["returncode"] = proc.returncode
    if proc.returncode < 0:
        result["signal"] = signal.Signals(-proc.returncode).name
    result["progress"] = [l for l in proc.stdout.splitlines() if l]
    result["stderr_tail"] = [clean(l) for l in proc.stderr.splitlines() if l][-5:]
    entry = arrays = None
    if proc.returncode == 0:
        with open(os.path.join(workdir, f"child_{name}.json")) as f:
            entry = json.load(f, object_pairs_hook=collections.OrderedDict)
        with numpy.load(os.path.join(workdir, f"child_{name}.npz")) as z:
            arrays = {k: z[k] for k in z.files}
    return result, entry, arrays


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megatron", required=True,
                    help="extracted Megatron-LM source (the directory that holds megatron/core)")
    ap.add_argument("--out", required=True, help="output directory (emptied of old references)")
    ap.add_argument("--megatron-commit", help="commit of --megatron, if it is not a git checkout")
    ap.add_argument("--keep-temp", action="store_true")
    ap.add_argument("--_child-case", help=argparse.SUPPRESS)
    ap.add_argument("--_helpers-dir", help=argparse.SUPPRESS)
    ap.add_argument("--_workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.megatron = os.path.abspath(args.megatron)
    corpus_dir = os.path.join(os.path.abspath(args.out), "corpora")

    if args._child_case:  # child: one case, no output files; progress on stdout
        install_shims(args.megatron, args._helpers_dir)
        corpora = json.load(open(os.path.join(args._workdir, "corpora.json")))
        name = args._child_case
        entry, arrays = run_case(name, cases()[name], corpus_dir, corpora,
                                 os.path.join(args._workdir, "child_cache"), progress=sys.stdout)
        with open(os.path.join(args._workdir, f"child_{name}.json"), "w") as f:
            json.dump(jsonable(entry), f)
        save_npz(os.path.join(args._workdir, f"child_{name}.npz"), arrays)
        print("case completed without error", flush=True)
        return

    commit = megatron_commit(args.megatron, args.megatron_commit)
    workdir = tempfile.mkdtemp(prefix="megatron_refs_")
    try:
        helpers_dir = compile_helpers(args.megatron, workdir)
        helpers_dirs = {"makefile": helpers_dir}
        install_shims(args.megatron, helpers_dir)

        os.makedirs(args.out, exist_ok=True)
        if os.path.isdir(corpus_dir):
            shutil.rmtree(corpus_dir)
        for f in os.listdir(args.out):
            if f.endswith(".npz") or f == "manifest.json":
                os.remove(os.path.join(args.out, f))
        os.makedirs(corpus_dir)

        corpora = collections.OrderedDict()
        for cname, (tok, writer, docs) in corpus_specs().items():
            prefix = os.path.join(corpus_dir, cname)
            corpora[cname] = write_corpus(prefix, tok, writer, docs)
            corpora[cname]["files"] = {
                os.path.basename(p): dict(bytes=os.path.getsize(p), sha256=sha256(p))
                for p in (prefix + ".bin", prefix + ".idx")}
        with open(os.path.join(workdir, "corpora.json"), "w") as f:
            json.dump(corpora, f)

        manifest = collections.OrderedDict()
        manifest["generator"] = "testing/megatron_core/make_references.py"
        manifest["megatron_commit"] = commit
        manifest["megatron_file_sha256"] = {
            p: sha256(os.path.join(args.megatron, p)) for p in MEGATRON_FILES}
        manifest["environment"] = dict(
            python=sys.version.split()[0], numpy=numpy.__version__,
            torch=__import__("torch").__version__)
        manifest["npz_layout"] = (
            "<case>.npz keys are '<split>/<array>'. Samples (indices 0..len-1 of the top-level "
            "dataset, i.e. the GPTDataset or the BlendedDataset): tokens, labels, loss_mask, "
            "position_ids, attention_mask (create_attention_mask is on in every case; "
            "[N,1,S,S] bool, True = masked), and dataset_id for blends. GPTDataset indices: "
            "<split>/document_index, <split>/sample_index, <split>/shuffle_index; for blends "
            "<split>/dataset_index, <split>/dataset_sample_index, <split>/weights_final and "
            "<split>/ds<k>/{document,sample,shuffle}_index per source k.")
        manifest["helpers_builds"] = BUILD_COMMANDS
        manifest["tokenizers"] = {"small": TOK_SMALL, "large": TOK_LARGE}
        manifest["corpora"] = corpora
        manifest["cases"] = collections.OrderedDict()
        cache_root = os.path.join(workdir, "cache")
        for name, spec in cases().items():
            variant = spec.get("helpers", "makefile")
            if variant not in helpers_dirs:
                helpers_dirs[variant] = compile_helpers(args.megatron, workdir, variant)
            arrays = None
            if spec.get("subprocess"):
                outcome, entry, arrays = run_child_case(args, name, workdir, helpers_dirs[variant])
                if entry is None:
                    entry = collections.OrderedDict(description=spec["doc"], corpora=spec["corpus"])
                    entry["sequence_length"] = spec.get("sequence_length", SEQ_LEN)
                    entry["builder_sizes"] = spec["sizes"]
                    entry["split"] = spec["split"]
                entry["helpers_build"] = variant
                entry["outcome"] = outcome
                entry["error"] = outcome["returncode"] != 0
            else:
                entry, arrays = run_case(name, spec, corpus_dir, corpora, cache_root)
                entry["helpers_build"] = variant
            if arrays is not None:
                npz = os.path.join(args.out, name + ".npz")
                save_npz(npz, arrays)
                entry["npz"] = dict(file=os.path.basename(npz), bytes=os.path.getsize(npz),
                                    sha256=sha256(npz))
            manifest["cases"][name] = entry
            print(f"{name}: done", flush=True)
        with open(os.path.join(args.out, "manifest.json"), "w") as f:
            json.dump(jsonable(manifest), f, indent=1)
            f.write("\n")
    finally:
        if args.keep_temp:
            print("temp dir kept:", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
