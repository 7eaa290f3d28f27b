"""Built-in CPU engines (numpy): matmul, conv_fprop, sdpa_fwd, layernorm, rmsnorm."""

from .conv import DirectConv, FftConv, Im2colConv
from .matmul import BlasMatmul, BlockedMatmul, EinsumMatmul
from .norms import EinsumRmsNorm, NumpyRmsNorm, OnePassLayerNorm, TwoPassLayerNorm
from .sdpa import MaterializedSdpa, OnlineSoftmaxSdpa

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
)

__all__ = ["ENGINES"]
