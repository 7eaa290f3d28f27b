"""Two models written with standard ``torch.nn`` modules and functional calls, and factories for farm capture/apply.

    farm capture examples/models.py:decoder --with batch=1 --with batch=8            # tiny sizes by default
    farm capture examples/models.py:decoder --with size=qwen2.5-7b,batch=1 --meta    # the real shapes, no memory

``decoder``: a Qwen2.5-7B-shaped decoder's decode step (RMSNorm, a fused qkv projection with bias, SDPA with
grouped-query attention over a KV cache, an output projection, a SiLU-gated MLP with a fused gate/up projection,
the LM head; random weights). ``resnet50``: ResNet-50 (bottleneck blocks, batch norm in eval mode), channels-last.
Nothing in them knows about the farm: ``farm.apply`` routes their calls from the outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class DecoderSize:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocab: int
    context: int  # tokens in the KV cache the step attends over

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SIZES = {
    "tiny": DecoderSize(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2, vocab=256, context=32),
    "small": DecoderSize(hidden=512, heads=8, kv_heads=2, intermediate=1536, layers=4, vocab=4096, context=512),
    # Qwen2.5-7B: 28 layers, 28 query heads and 4 key/value heads of 128, MLP 18944, vocabulary 152064
    "qwen2.5-7b": DecoderSize(hidden=3584, heads=28, kv_heads=4, intermediate=18944, layers=28, vocab=152064,
                              context=4096),
}


class Attention(nn.Module):
    def __init__(self, s: DecoderSize, batch: int, eps: float, **kw: object) -> None:
        super().__init__()
        self.s = s
        self.qkv_proj = nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=True, **kw)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False, **kw)
        cache = (batch, s.kv_heads, s.context, s.head_dim)
        self.register_buffer("k_cache", torch.randn(cache, **kw), persistent=False)
        self.register_buffer("v_cache", torch.randn(cache, **kw), persistent=False)

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        s, (b, t, _) = self.s, x.shape
        q, k, v = self.qkv_proj(x).split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
        q = q.view(b, t, s.heads, s.head_dim).transpose(1, 2)
        self.k_cache[:, :, pos:pos + t] = k.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        self.v_cache[:, :, pos:pos + t] = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, s.heads * s.head_dim))


class MLP(nn.Module):
    def __init__(self, s: DecoderSize, **kw: object) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(s.hidden, 2 * s.intermediate, bias=False, **kw)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Layer(nn.Module):
    def __init__(self, s: DecoderSize, batch: int, eps: float, **kw: object) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(s.hidden, eps=eps, **kw)
        self.self_attn = Attention(s, batch, eps, **kw)
        self.post_attention_layernorm = nn.RMSNorm(s.hidden, eps=eps, **kw)
        self.mlp = MLP(s, **kw)

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """One decode step: ``model(tokens [batch, 1], pos)`` -> logits [batch, 1, vocab]."""

    def __init__(self, s: DecoderSize, batch: int, eps: float = 1e-6, **kw: object) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden, **kw)
        self.layers = nn.ModuleList(Layer(s, batch, eps, **kw) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.hidden, eps=eps, **kw)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False, **kw)

    def forward(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, pos)
        return self.lm_head(self.norm(x))


def decoder(batch: int = 1, size: str = "tiny", device: str | None = None, dtype: str | None = None,
            eps: float = 1e-6, seed: int = 0) -> tuple[nn.Module, tuple[object, ...]]:
    """The decoder's decode step for ``batch`` sequences (M = batch), its KV cache full but for the last slot.
    Defaults: CUDA when a GPU is there, else the CPU; bf16 but on the CPU (``meta`` stands for a GPU)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dt = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else torch.bfloat16)
    s = SIZES[size]
    torch.manual_seed(seed)
    model = Decoder(s, batch, eps, device=device, dtype=dt).eval()
    tokens = torch.randint(0, s.vocab, (batch, 1), device=device)
    return model, (tokens, s.context - 1)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int, **kw: object) -> None:
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False, **kw)
        self.bn1 = nn.BatchNorm2d(width, **kw)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False, **kw)
        self.bn2 = nn.BatchNorm2d(width, **kw)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False, **kw)
        self.bn3 = nn.BatchNorm2d(cout, **kw)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False, **kw),
                                            nn.BatchNorm2d(cout, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000, widths: tuple[int, ...] = (64, 128, 256, 512),
                 blocks: tuple[int, ...] = (3, 4, 6, 3), **kw: object) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False, **kw)
        self.bn1 = nn.BatchNorm2d(widths[0], **kw)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            layer = []
            for j in range(n):
                layer.append(Bottleneck(cin, w, 2 if j == 0 and i > 0 else 1, **kw))
                cin = w * 4
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(batch: int = 32, image: int = 224, device: str | None = None, dtype: str | None = None,
             width: int = 64, seed: int = 0) -> tuple[nn.Module, tuple[object, ...]]:
    """ResNet-50 inference on ``batch`` images, channels-last (fp16 but on the CPU: fp32); ``width`` and
    ``image`` shrink it for a CPU (width=8, image=32)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dt = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else torch.float16)
    torch.manual_seed(seed)
    widths = tuple(width * f for f in (1, 2, 4, 8))
    model = ResNet50(widths=widths, device=device, dtype=dt).eval().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, image, image, device=device, dtype=dt).to(memory_format=torch.channels_last)
    return model, (x,)
