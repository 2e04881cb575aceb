"""Triton kernels, each beside the plain-torch reference that is its CPU path and test oracle."""
