"""Wiring of the package's computations into TVM: strategies, layout hooks, toolchains."""
