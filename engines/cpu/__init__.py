"""Built-in CPU engines: numpy's matmul, conv_fprop, sdpa_fwd, layernorm, rmsnorm, and torch's own CPU kernels
for the calls of a torch model (their default; engines.cpu.torch_ops)."""

from .conv import DirectConv, FftConv, Im2colConv
from .matmul import BlasMatmul, BlockedMatmul, EinsumMatmul
from .norms import EinsumRmsNorm, NumpyRmsNorm, OnePassLayerNorm, TwoPassLayerNorm
from .sdpa import MaterializedSdpa, OnlineSoftmaxSdpa
from .torch_ops import TorchCpuConv, TorchCpuMatmul, TorchCpuModuleRmsNorm, TorchCpuNorm, TorchCpuSdpa

ENGINES = (
    BlasMatmul(),
    EinsumMatmul(),
    BlockedMatmul(),
    Im2colConv(),
    FftConv(),
    DirectConv(),
    MaterializedSdpa(),
    OnlineSoftmaxSdpa(),
    TwoPassLayerNorm(),
    OnePassLayerNorm(),
    NumpyRmsNorm(),
    EinsumRmsNorm(),
    TorchCpuMatmul(),
    TorchCpuConv(),
    TorchCpuSdpa(),
    TorchCpuNorm("layernorm"),
    TorchCpuNorm("rmsnorm"),
    TorchCpuModuleRmsNorm(),
)

__all__ = ["ENGINES"]
