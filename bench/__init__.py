"""OSU-style benchmarks of erdmampi against mpi4py+MPICH and torch.distributed gloo.

Modules: ``pingpong``, ``collectives`` (``allreduce`` = collectives with one op),
``gloorun`` (launcher for the gloo stack) and ``run_all`` (all stacks, alternating,
JSON + markdown + PNG). See docs/benchmarks.md.
"""
