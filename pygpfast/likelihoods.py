"""Likelihoods (placeholder until written)."""
