"""Collage: cost-driven partitioning of Relay models across toolchains."""
