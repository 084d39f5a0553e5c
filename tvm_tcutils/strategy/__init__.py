"""Wiring of the package's computations into TVM: strategies, alter-op/legalize hooks, toolchains."""
