"""Distribute Python objects with the lowercase (pickle-based) API.

Rank 0 splits a list of records into one chunk per rank (scatter); every rank
sums its chunk; the partial results come back to rank 0 (gather) and the grand
total goes to every rank (allreduce), which rank 0 checks.

    erdmarun -n 4 python hpc_examples/parallel_sum_obj.py
"""
from erdmampi import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

N = 1000
if rank == 0:
    records = [{"id": i, "value": i * i, "name": "item-%d" % i} for i in range(N)]
    chunks = [records[r::size] for r in range(size)]
else:
    chunks = None

mine = comm.scatter(chunks, root=0)
partial = {"rank": rank, "count": len(mine), "sum": sum(r["value"] for r in mine)}

partials = comm.gather(partial, root=0)
total = comm.allreduce(partial["sum"], op=MPI.SUM)
config = comm.bcast({"expected": sum(i * i for i in range(N))} if rank == 0 else None, root=0)

if rank == 0:
    for p in partials:
        print("rank %d: %d records, sum %d" % (p["rank"], p["count"], p["sum"]))
    print("total %d, expected %d: %s"
          % (total, config["expected"], "OK" if total == config["expected"] else "WRONG"))
assert total == config["expected"]
