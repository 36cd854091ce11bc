"""Writes and reads Megatron-LM indexed datasets (`<prefix>.bin` + `<prefix>.idx`, MMIDIDX
version 1) for ferry's tests, written from the layout Megatron-LM documents in
megatron/core/datasets/indexed_dataset.py (_IndexWriter / _IndexReader; see docs/data.md):

  9 bytes   magic b"MMIDIDX\\x00\\x00"
  uint64    version, 1
  uint8     token dtype code (4 = int32, 8 = uint16; Megatron's DType enum)
  uint64    sequence count S
  uint64    document index count D (documents + 1)
  int32[S]  sequence lengths (tokens)
  int64[S]  sequence pointers (byte offsets into the .bin, cumulative)
  int64[D]  document indices: the first sequence of each document, then S
  int8[S]   sequence modes (multimodal datasets only)

All little-endian. Also a pure-Python reference of ferry's packing (reference_sample)."""

import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def write_indexed(prefix, documents, dtype=np.uint16, modes=False):
    """documents: a list of documents, each a list of sequences (lists of token ids)."""
    dtype = np.dtype(dtype)
    lengths, pointers, doc_index = [], [], [0]
    offset = 0
    with open(prefix + ".bin", "wb") as bin_file:
        for doc in documents:
            for seq in doc:
                data = np.asarray(seq, dtype=dtype.newbyteorder("<"))
                bin_file.write(data.tobytes())
                lengths.append(len(seq))
                pointers.append(offset)
                offset += data.nbytes
            doc_index.append(len(lengths))
    with open(prefix + ".idx", "wb") as idx:
        idx.write(MAGIC)
        idx.write(struct.pack("<QBQQ", 1, CODES[dtype], len(lengths), len(doc_index)))
        idx.write(np.asarray(lengths, dtype="<i4").tobytes())
        idx.write(np.asarray(pointers, dtype="<i8").tobytes())
        idx.write(np.asarray(doc_index, dtype="<i8").tobytes())
        if modes:
            idx.write(bytes(len(lengths)))


def write_indexed_arrays(prefix, tokens, lengths):
    """The same layout from numpy arrays, fast for large corpora: `tokens` (uint16 or int32)
    is the .bin; `lengths` (summing to len(tokens)) are one-sequence documents."""
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype="<i4")
    assert int(lengths.sum()) == len(tokens)
    tokens.astype(tokens.dtype.newbyteorder("<")).tofile(prefix + ".bin")
    pointers = np.zeros(len(lengths), dtype="<i8")
    np.cumsum(lengths[:-1].astype(np.int64) * tokens.dtype.itemsize, out=pointers[1:])
    with open(prefix + ".idx", "wb") as idx:
        idx.write(MAGIC)
        idx.write(struct.pack("<QBQQ", 1, CODES[tokens.dtype], len(lengths), len(lengths) + 1))
        idx.write(lengths.tobytes())
        idx.write(pointers.tobytes())
        idx.write(np.arange(len(lengths) + 1, dtype="<i8").tobytes())


def reference_sample(documents, seq_len, index):
    """ferry's sample `index` of these documents: tokens, position_ids, cu_seqlens (padded
    with seq_len to seq_len + 1 entries) and num_seqs, computed the slow, obvious way."""
    stream, starts = [], set()
    for doc in documents:
        starts.add(len(stream))
        for seq in doc:
            stream.extend(int(t) for t in seq)
    begin = index * seq_len
    tokens = stream[begin:begin + seq_len + 1]
    positions, cu, segment = [], [0], 0
    for p in range(seq_len + 1):
        if p > 0 and begin + p in starts:
            segment = p
            if p < seq_len:
                cu.append(p)
        positions.append(p - segment)
    num_seqs = len(cu)
    cu += [seq_len] * (seq_len + 1 - len(cu))
    return tokens, positions, cu, num_seqs
