"""GPU engines on PyTorch and Triton (NVIDIA, and AMD through the same Python APIs).

torch.matmul   PyTorch's default GEMM path (the default candidate)
torch.blas     GEMM with the BLAS library chosen and reduced-precision knobs
torch.matmul_padded  GEMM on zero-padded aligned copies (odd M, N or K), as Inductor's pad_mm, or
                     split: aligned columns of C by the library, the rest by the pad kernel
triton.gemm    a Triton GEMM with the tile knobs autotuners search
triton.gemm_padded  the Triton GEMM on zero-padded aligned copies of A and B (odd K or N)
triton.gemm_splitk  a split-K Triton GEMM for skinny A (M <= 256: LLM decode), the split and who sums the slices knobs
triton.gemv    a Triton matrix-vector product for one row of A and nn.Linear's B = W.T (decode at M = 1)
cuda.decode_gemm  a CUDA C++ tensor-core GEMM (NVRTC, cuda-python) for A of at most 16 rows (decode), K split
                  over a thread-block cluster and summed in distributed shared memory
torch.sdpa     attention with the backend forced (flash, efficient, cudnn, math) or auto
torch.rmsnorm_module  a hand-written RMSNorm's own computation (the default of its problem, library "module")
torch.rmsnorm  F.rms_norm
triton.rmsnorm  a fused RMSNorm kernel, a row block a program, with the hand-written module's rounding
liger.rmsnorm  Liger-Kernel's fused RMSNorm (pip install 'tunefarm[liger]'), in the module's casting mode
triton.decode_attention  split-KV attention for at most 16 query tokens over a long KV cache (flash-decoding),
                         a program per cache chunk and key/value head with all its query heads (GQA)
triton.conv    a Triton implicit-GEMM forward convolution: tiles and how the filter is walked (a tap at a time
               or taps and channels as one axis, for few channels) as knobs, configurations listed per shape
torch.conv     cuDNN convolutions (fprop, dgrad, wgrad): layout, determinism, benchmark priming
cudnn.graph    cuDNN's own execution plans (graph API, nvidia-cudnn-frontend): convolutions, matmul,
               forward attention; each listed plan a candidate, named by engine id and knobs
cublaslt       cuBLASLt's algorithms (planned with nvmath-python): each listed algorithm a candidate

torch, triton, cudnn, nvmath, liger_kernel and cuda-python are imported only when an engine is used on a GPU device.
"""

from .conv import TorchConv
from .cublaslt import CublasLt
from .cuda_decode import CudaDecodeGemm
from .cudnn_graph import CudnnGraph
from .liger import LigerRmsNorm
from .matmul import TorchBlas, TorchMatmul, TorchMatmulPadded
from .norms import TorchModuleRmsNorm, TorchRmsNorm, TritonRmsNorm
from .sdpa import TorchSdpa
from .triton_conv import TritonConv
from .triton_decode_attention import TritonDecodeAttention
from .triton_gemm import TritonGemm, TritonGemmPadded
from .triton_gemv import TritonGemv
from .triton_splitk import TritonSplitK

_TRITON = TritonGemm()
ENGINES = (TorchMatmul(), TorchBlas(), TorchMatmulPadded(), _TRITON, TritonGemmPadded(_TRITON.compile_pool),
           TritonSplitK(_TRITON.compile_pool), TritonGemv(_TRITON.compile_pool), CudaDecodeGemm(), TorchSdpa(),
           TritonDecodeAttention(_TRITON.compile_pool), TorchConv(), TritonConv(_TRITON.compile_pool),
           CudnnGraph(), CublasLt(), TorchModuleRmsNorm(), TorchRmsNorm(), TritonRmsNorm(_TRITON.compile_pool), LigerRmsNorm())

__all__ = ["ENGINES"]
