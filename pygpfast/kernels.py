"""Kernels (placeholder until written)."""
