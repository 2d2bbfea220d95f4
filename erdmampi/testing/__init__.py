"""Test utilities that ship with erdmampi: :mod:`erdmampi.testing.wan`, a WAN test
bed in network namespaces (rate, loss and one-way delay between sites)."""
