"""Utilities built on the public ``erdmampi.MPI`` API (as ``mpi4py.util``)."""
