"""Models from transformers and timm, built from their configs (random weights, nothing downloaded), as targets
for ``farm capture`` and ``farm apply``: each returns ``(model, args, kwargs)``, one step being
``model(*args, **kwargs)``. Nothing in them is changed for the farm.

    farm capture examples/library_models.py:llama --with batch=1 --with batch=8 --out runs/llama/workload.yaml
    farm capture examples/library_models.py:resnet --with batch=8,channels_last=1 --out runs/resnet/workload.yaml

Decoders (``llama``, ``qwen2``, ``gpt2``) run one decode step over a static KV cache of ``context`` tokens, the
way ``generate`` with ``cache_implementation="static"`` does: transformers builds the padding mask of the cache
and passes it to attention. ``size="tiny"`` (the tests' and CPU's) or the real shapes of a public model
(``size="llama3.2-1b"``, ``"qwen2.5-0.5b"``...; bf16 on a GPU). Needs ``pip install 'tunefarm[models]'``.
"""

from __future__ import annotations

from typing import Any

import torch

# decoder configs: (hidden, intermediate, layers, heads, kv heads, vocab); tiny for tests on a CPU
DECODERS = {
    "tiny": (64, 128, 2, 4, 2, 256),
    "small": (512, 1536, 4, 8, 2, 4096),
    "llama3.2-1b": (2048, 8192, 16, 32, 8, 128256),
    "llama3.1-8b": (4096, 14336, 32, 32, 8, 128256),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 152064),
    "mistral-7b": (4096, 14336, 32, 32, 8, 32768),
}


def _device_dtype(device: str | None, dtype: str | None) -> tuple[str, torch.dtype]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return device, getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else torch.bfloat16)


def _decode_step(model: Any, config: Any, batch: int, context: int, device: str, seed: int) -> tuple[Any, ...]:
    """A static KV cache filled by a prefill of ``context - 1`` tokens; the step decodes the last slot."""
    from transformers import StaticCache

    gen = torch.Generator().manual_seed(seed)
    vocab = config.vocab_size
    cache = StaticCache(config=config, max_cache_len=context)
    prompt = torch.randint(0, vocab, (batch, context - 1), generator=gen).to(device)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True,
              cache_position=torch.arange(context - 1, device=device))
    token = torch.randint(0, vocab, (batch, 1), generator=gen).to(device)
    kwargs = {"past_key_values": cache, "use_cache": True,
              "cache_position": torch.tensor([context - 1], device=device)}
    model.register_forward_pre_hook(SameSlot(cache, context - 1))
    return model, (token,), kwargs


class SameSlot:
    """A forward pre-hook: the cache counts the tokens written into it, so each step decodes into the same slot
    again (a fill that a CUDA graph of the step replays too) and the step can be repeated, as benchmarks and
    checks repeat it."""

    def __init__(self, cache: Any, position: int) -> None:
        self.cache, self.position = cache, position

    def __call__(self, _module: Any, _args: Any) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.position)


def _decoder(kind: str, batch: int, context: int, size: str, device: str | None, dtype: str | None,
             seed: int, layers: int = 0, window: int = 0) -> tuple[Any, ...]:
    import transformers

    hidden, inter, all_layers, heads, kv, vocab = DECODERS[size]
    layers = layers or all_layers
    device, dt = _device_dtype(device, dtype)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=max(context, 128),
                  attn_implementation="sdpa")
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=window or None)
        cls = transformers.MistralForCausalLM
    else:
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(config).to(dt).eval()
    return _decode_step(model, config, batch, context, device, seed)


def llama(batch: int = 1, context: int = 64, size: str = "tiny", device: str | None = None,
          dtype: str | None = None, seed: int = 0, layers: int = 0) -> tuple[Any, ...]:
    """transformers' Llama (hand-written RMSNorm, rotary embeddings, GQA) decoding one token a sequence;
    ``layers``: fewer layers than the size has (its shapes, in less memory and time)."""
    return _decoder("llama", batch, context, size, device, dtype, seed, layers)


def qwen2(batch: int = 1, context: int = 64, size: str = "tiny", device: str | None = None,
          dtype: str | None = None, seed: int = 0, layers: int = 0) -> tuple[Any, ...]:
    """transformers' Qwen2 (qkv projections with a bias, GQA) decoding one token a sequence (``layers``: as
    llama's)."""
    return _decoder("qwen2", batch, context, size, device, dtype, seed, layers)


def mistral(batch: int = 1, context: int = 64, size: str = "tiny", device: str | None = None,
            dtype: str | None = None, seed: int = 0, layers: int = 0, window: int = 0) -> tuple[Any, ...]:
    """transformers' Mistral: Llama's layers, attention over a sliding ``window`` of the last tokens (0: none;
    below ``context`` the mask transformers builds hides the cache's first slots)."""
    return _decoder("mistral", batch, context, size, device, dtype, seed, layers, window)


def gpt2(batch: int = 1, context: int = 64, size: str = "tiny", device: str | None = None,
         dtype: str | None = None, seed: int = 0) -> tuple[Any, ...]:
    """transformers' GPT-2 (its Conv1D layers are addmm calls) decoding one token a sequence; ``size`` "tiny"
    or "gpt2" (124M)."""
    import transformers

    device, dt = _device_dtype(device, dtype)
    shape = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256) if size == "tiny" else {}
    config = transformers.GPT2Config(n_positions=max(context, 128), attn_implementation="sdpa", **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.GPT2LMHeadModel(config).to(dt).eval()
    return _decode_step(model, config, batch, context, device, seed)


def bert(batch: int = 2, seq: int = 16, device: str | None = None, dtype: str | None = None,
         seed: int = 0) -> tuple[Any, ...]:
    """transformers' BERT encoder (tiny) over a padded batch: an attention mask, LayerNorm eps 1e-12."""
    import transformers

    device, dt = _device_dtype(device, dtype)
    config = transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.BertModel(config).to(dt).eval()
    ids = torch.randint(0, 256, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    mask[0, seq // 2:] = 0  # a padded sequence
    return model, (ids,), {"attention_mask": mask}


def _timm(name: str, batch: int, image: int, channels_last: int, device: str | None, dtype: str | None,
          seed: int, **kw: Any) -> tuple[Any, ...]:
    import timm

    device, dt = _device_dtype(device, dtype)
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, **kw).to(device=device, dtype=dt).eval()
    x = torch.randn(batch, 3, image, image, device=device, dtype=dt)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, (x,), {}


def resnet(batch: int = 2, image: int = 64, channels_last: int = 0, name: str = "resnet18",
           device: str | None = None, dtype: str | None = None, seed: int = 0) -> tuple[Any, ...]:
    """timm's ResNet (``resnet18``; ``name=resnet50``), NCHW or channels-last."""
    return _timm(name, batch, image, channels_last, device, dtype, seed)


def convnext(batch: int = 2, image: int = 64, channels_last: int = 1, device: str | None = None,
             dtype: str | None = None, seed: int = 0) -> tuple[Any, ...]:
    """timm's ConvNeXt-Atto (depthwise 7x7 convolutions, LayerNorm2d, Linear MLPs), channels-last by default."""
    return _timm("convnext_atto", batch, image, channels_last, device, dtype, seed)


def vit(batch: int = 2, image: int = 64, device: str | None = None, dtype: str | None = None,
        seed: int = 0) -> tuple[Any, ...]:
    """timm's ViT-Tiny (patch 16) at ``image`` pixels: attention without a mask, LayerNorm eps 1e-6."""
    return _timm("vit_tiny_patch16_224", batch, image, 0, device, dtype, seed, img_size=image)
