"""Batch fields as numpy arrays and torch tensors."""

import warnings


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
