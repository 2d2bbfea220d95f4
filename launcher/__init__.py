"""erdmarun: the erdmampi launcher and its rendezvous store server.

Pure Python; never imports ``erdmampi.MPI`` or the engine.
"""
