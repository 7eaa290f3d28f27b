"""Device runtimes behind one interface (see base.Runtime): CPU, CUDA, HIP."""

from .base import Runtime

__all__ = ["Runtime"]
