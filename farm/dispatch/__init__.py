"""The per-call path: what a production call of an op runs (farm.ops), and what the tuner and farm verify time.

``calls.OpCalls`` holds the op entry points (matmul, sdpa, conv2d, layernorm, rmsnorm) over a binder that
chooses the plan for a new layout; ``binding`` the bound call a cache hit runs; ``frameworks`` how numpy,
torch and simulated tensors are described and allocated.
"""
