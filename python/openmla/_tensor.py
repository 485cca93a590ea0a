"""torch tensors as the plain tuples that openmla._C reads.

A tuple is (data_ptr, dtype name, shape, strides in elements, device type, device index).
No copy is made and no dtype is converted: the C++ layer sees the caller's memory as is.
"""

import torch

# openmla's dtype names where torch's differ; every other torch dtype keeps its own name, and
# the C++ layer rejects any it does not support with a ValueError naming the argument.
_DTYPE_NAMES = {torch.float8_e4m3fn: "float8_e4m3"}


def dtype_name(dtype):
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def view(tensor):
    """The _C tuple of a tensor, or None for an absent optional."""
    if tensor is None:
        return None
    device = tensor.device
    return (
        tensor.data_ptr(),
        dtype_name(tensor.dtype),
        list(tensor.shape),
        list(tensor.stride()),
        device.type,
        device.index or 0,
    )


def stream_of(tensor):
    """The current CUDA stream of the tensor's device as an integer handle; 0 on the CPU."""
    if tensor.device.type != "cuda":
        return 0
    return torch.cuda.current_stream(tensor.device).cuda_stream
