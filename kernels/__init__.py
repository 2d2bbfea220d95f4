"""Compression codecs for collectives (Numba CPU and CUDA kernels): see issue 4."""
