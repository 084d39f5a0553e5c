"""Toolchains Collage partitions a model across."""
