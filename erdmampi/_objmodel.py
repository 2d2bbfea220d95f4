"""Pickling of MPI handle objects, as mpi4py's object model defines it.

A predefined object pickles by name (and unpickles as that very object), an
equal copy of one pickles as ``Type(CONSTANT)``, any other object refuses
with ValueError.  Classes using this set ``__module__ = "erdmampi.MPI"`` so
that names resolve in the module that exports them.
"""

__all__ = ["reduce_predefined"]


def reduce_predefined(obj, constants):
    """``__reduce__`` result for ``obj``; ``constants`` is ``[(name, object)]``."""
    for name, const in constants:
        if obj is const:
            return name
    for name, const in constants:
        if obj == const:
            return (type(obj), (const,))
    raise ValueError(f"cannot serialize '{type(obj).__module__}."
                     f"{type(obj).__name__}' instance")
