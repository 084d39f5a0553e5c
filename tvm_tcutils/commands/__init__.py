"""Subcommands of the ``tvm-tcutils`` command line (see :mod:`tvm_tcutils.cli`)."""
