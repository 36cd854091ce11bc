"""Whether the GPU tests can run here, shared by the modules of tests/gpu: each calls
skip_reason() at import, prints the reason ctest looks for (SKIP_REGULAR_EXPRESSION) and
skips its classes with it."""

# What ferryd logs when a CUDA or nvJPEG call fails; a clean run logs none of them.
CUDA_ERROR_MARKERS = ("CUDA_ERROR", "cudaError", "nvjpeg error", "NVJPEG_STATUS")


def skip_reason(min_gpus=1):
    """None when PyTorch sees at least `min_gpus` GPUs and libferry can use the GPU, else
    why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU visible)"
    if torch.cuda.device_count() < min_gpus:
        return "%d GPU visible; these tests need %d or more" % (torch.cuda.device_count(),
                                                                  min_gpus)
    import ferry
    from ferry import _lib
    try:
        _lib.cuda_pci_bus_id(0)
    except ferry.FerryError as e:
        return "libferry cannot use the GPU: %s" % e
    return None


def announce(reason):
    """Prints the skip line ctest recognises, when there is a reason; returns it."""
    if reason is not None:
        print("GPU tests skipped: %s" % reason, flush=True)
    return reason
