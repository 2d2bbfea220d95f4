"""Import-layer contracts, checked on the source (imports inside functions count:
they run as soon as the function does).

* the collective algorithms (erdmampi.collectives) run over a small Transport
  and never reach the communicator layer, the engine or the MPI facade;
* the codecs (erdmampi.kernels) are self-contained: nothing of erdmampi outside
  erdmampi.kernels;
* the launcher never starts MPI: erdmampi.MPI and the engine are not reachable
  from erdmampi.launcher;
* erdmampi._engine is the only importer of the cffi module erdmampi._erdma.

A contract is checked on the transitive closure of the import graph, so a
forbidden module reached through a chain of allowed ones fails too, and the
failure names the chain.
"""
import ast
from pathlib import Path

import pytest

from harness import REPO

# where each top-level source folder is installed (setup.py's package_dir)
ROOTS = {"erdmampi": "erdmampi", "kernels": "erdmampi.kernels", "launcher": "erdmampi.launcher"}


def _modules():
    mods = {}
    for folder, pkg in ROOTS.items():
        for f in (REPO / folder).rglob("*.py"):
            parts = list(f.relative_to(REPO / folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            name = ".".join([pkg] + parts)
            mods[name] = (f, is_pkg)
    return mods


MODS = _modules()
# the C extensions are modules too, for the last contract
EXTENSIONS = {"erdmampi._erdma", "erdmampi._erdma_dpdk", "erdmampi._membuf"}


def _resolve(name):
    """The module (or extension) `name` refers to, or its nearest module parent."""
    while name:
        if name in MODS or name in EXTENSIONS:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(name):
    path, is_pkg = MODS[name]
    package = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from pkg import sub" imports the submodule when there is one
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            r = _resolve(t)
            if r and r != name:
                out.add(r)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
    for dep in list(out):
        parts = dep.split(".")
        out.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                   if p in MODS and p != name)
    return out


GRAPH = {m: _imports(m) for m in MODS}


def _chains(start_prefix, forbidden):
    """Shortest import chain from a module under start_prefix to a forbidden one."""
    bad = []
    for start in sorted(m for m in MODS if m == start_prefix or m.startswith(start_prefix + ".")):
        seen, frontier = {start: None}, [start]
        while frontier:
            nxt = []
            for m in frontier:
                for d in sorted(GRAPH.get(m, ())):
                    if d in seen:
                        continue
                    seen[d] = m
                    if forbidden(d):
                        chain, x = [d], m
                        while x is not None:
                            chain.append(x)
                            x = seen[x]
                        bad.append(" -> ".join(reversed(chain)))
                        nxt = []
                        frontier = []
                        break
                    nxt.append(d)
                else:
                    continue
                break
            frontier = nxt
    return bad


def _under(*prefixes):
    return lambda m: any(m == p or m.startswith(p + ".") for p in prefixes)


def test_the_graph_is_real():
    # the checker itself: known edges are found, so an empty result means something
    assert "erdmampi._engine" in GRAPH["erdmampi.bootstrap"]
    assert "erdmampi.kernels.codec" in GRAPH["erdmampi.kernels"]
    assert "erdmampi.rendezvous" in GRAPH["erdmampi.launcher.store_server"]
    assert _chains("erdmampi.bootstrap", _under("erdmampi._engine"))


def test_collectives_never_reach_comm_engine_or_mpi():
    bad = _chains("erdmampi.collectives",
                  _under("erdmampi.comm", "erdmampi.comm_p2p", "erdmampi.comm_coll",
                         "erdmampi.comm_objcoll", "erdmampi._commrt", "erdmampi._engine",
                         "erdmampi._erdma", "erdmampi.MPI"))
    assert not bad, "\n".join(bad)


def test_kernels_stay_inside_kernels():
    bad = _chains("erdmampi.kernels",
                  lambda m: m.startswith("erdmampi.") and not _under("erdmampi.kernels")(m))
    assert not bad, "\n".join(bad)


def test_launcher_never_starts_mpi():
    bad = _chains("erdmampi.launcher",
                  _under("erdmampi.MPI", "erdmampi._engine", "erdmampi._erdma",
                         "erdmampi.comm", "erdmampi.bootstrap"))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("ext", ["erdmampi._erdma", "erdmampi._erdma_dpdk"])
def test_only_the_engine_wrapper_imports_the_cffi_module(ext):
    importers = sorted(m for m, deps in GRAPH.items() if ext in deps)
    assert importers and set(importers) <= {"erdmampi._engine"}, importers


def _imports_torch(name):
    """Whether module ``name`` itself imports torch (absolute imports)."""
    path, _ = MODS[name]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def test_only_erdmampi_torch_imports_torch():
    """torch is optional: nothing outside erdmampi.torch imports it (but the
    benchmark workloads of erdmampi.testing, which time torch's gloo as a
    reference stack), nor reaches erdmampi.torch through the import graph."""
    inside = _under("erdmampi.torch")
    direct = sorted(m for m in MODS if _imports_torch(m))
    assert "erdmampi.torch.process_group" in direct, direct
    assert all(inside(m) or _under("erdmampi.testing")(m) for m in direct), direct
    for start in sorted(m for m in MODS if not inside(m)):
        seen, frontier = {start}, [start]
        while frontier:
            frontier = [d for m in frontier for d in GRAPH.get(m, ()) if d not in seen]
            seen.update(frontier)
        reached = sorted(m for m in seen if inside(m))
        assert not reached, f"{start} reaches {reached}"
