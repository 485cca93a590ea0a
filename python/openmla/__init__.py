"""openmla: Multi-head Latent Attention kernels for NVIDIA Hopper, with a CPU reference.

The torch-facing functions live in openmla.ops and are re-exported here; they are also
registered as torch.ops.openmla.* custom ops (torch.compile and CUDA graphs work).
"""

from ._C import cuda_available, version

__version__ = version()

try:
    import torch  # noqa: F401
except ImportError:  # the C++ layer needs no torch; the tensor-facing API does
    pass
else:
    from .ops import *  # noqa: F401,F403
    from .ops import __all__ as _ops_all

    __all__ = ["cuda_available", "version", *_ops_all]
