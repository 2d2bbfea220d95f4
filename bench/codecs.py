"""Codec benchmark: our codecs against blosc2 and zstd on the data of
:mod:`bench.codec_data`.

For every data kind (float32 gradients, smooth float32 field, sparse int64)
and every codec: compression ratio (input bytes / encoded bytes), compress
and decompress throughput in GB/s of *input* bytes per second of the
calling thread's CPU time, i.e. on one core (best of ``--repeat`` runs after
a warm-up; output buffers preallocated where the API allows; wall-clock
figures are kept in the JSON), and for the lossy codecs the relative rms error
``||decode(encode(x)) - x|| / ||x||``.

Compared with blosc2 (zstd clevel 1 and lz4, each with byte shuffle and
with bitshuffle, ``nthreads=1``) and plain zstandard (levels 1 and 3).

    python -m bench.codecs [--size 16MiB] [--repeat 5] [--json F] [--md F]
                           [--kinds gradients,smooth] [--gpu]

``--md docs/codecs.md`` replaces the "Measured" section between the
``<!-- measured:begin -->`` / ``<!-- measured:end -->`` markers; any other
file gets the markdown tables.  ``--gpu`` also times the CUDA path with CUDA
events when a real GPU is present (it is skipped under the simulator or
without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from bench import codec_data

BEGIN = "<!-- measured:begin -->"
END = "<!-- measured:end -->"


def parse_size(s: str) -> int:
    s = s.strip()
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10,
             "m": 1 << 20, "g": 1 << 30, "kb": 1000, "mb": 10 ** 6, "gb": 10 ** 9,
             "b": 1}
    low = s.lower()
    for u in sorted(units, key=len, reverse=True):
        if low.endswith(u):
            return int(float(low[: -len(u)]) * units[u])
    return int(s)


def best_time(fn, repeat: int, min_time: float = 0.02) -> float:
    """Best time of one call of ``fn`` (warm-up first; a run repeats ``fn``
    until it lasts ``min_time`` so small inputs are timed well).

    The time is the calling thread's CPU time (``time.thread_time``): the
    single-core cost, which stays meaningful on a machine shared with other
    work (wall times are recorded too, see :data:`LAST_WALL`).  Every codec
    here runs in the calling thread (blosc2 with ``nthreads=1``, zstd
    without worker threads)."""
    global LAST_WALL
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_time / one))
    best = float("inf")
    best_wall = float("inf")
    for _ in range(repeat):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best_wall = min(best_wall, (time.perf_counter() - t0) / inner)
        best = min(best, (time.thread_time() - c0) / inner)
    LAST_WALL = best_wall
    return max(best, 1e-9)


LAST_WALL = 0.0


# -- the codecs ---------------------------------------------------------------

def _ours(name):
    from erdmampi import kernels
    try:
        return kernels.get(name)
    except (ImportError, AttributeError) as e:
        print(f"[codecs] {name}: not available ({e})", file=sys.stderr)
        return None


def run_ours(name, x, repeat):
    c = _ours(name)
    if c is None:
        return None
    try:
        c.check_dtype(x.dtype)
    except TypeError:
        return None
    out = np.empty(c.max_encoded_size(x.size, x.dtype), np.uint8)
    enc = c.encode(x, out)
    n = enc.size
    dec = np.empty_like(x)
    c.decode(enc, dec)
    row = {"codec": name, "lossless": c.lossless, "bytes": int(n)}
    if c.lossless:
        if dec.tobytes() != x.tobytes():
            raise AssertionError(f"{name}: round trip is not bit-exact")
    else:
        xf = x.astype(np.float64)
        row["rms_err"] = float(np.sqrt(np.mean((dec.astype(np.float64) - xf) ** 2))
                               / max(np.sqrt(np.mean(xf ** 2)), 1e-300))
    row["t_comp"] = best_time(lambda: c.encode(x, out), repeat)
    row["wall_comp"] = LAST_WALL
    encc = enc.copy()
    row["t_decomp"] = best_time(lambda: c.decode(encc, dec), repeat)
    row["wall_decomp"] = LAST_WALL
    if name == "lossless":
        from erdmampi.kernels import format as fmt
        table = fmt.parse(encc)[1]
        modes = (table >> 28).astype(int)
        row["modes"] = {int(m): int((modes == m).sum()) for m in np.unique(modes)}
    return row


def mode_breakdown(x, repeat, block_bytes=8192):
    """Per lossless mode, on every block of x: estimate, encode and decode
    throughput (GB/s of block bytes, CPU time) and the ratio the mode alone
    reaches (blocks it cannot compress counted raw): which mode limits the
    codec's speed."""
    from erdmampi.kernels.lossless import available_modes, mode_params
    b = x.view(np.uint8)
    it, isf = mode_params(x.dtype)
    nb = b.size // block_bytes
    blocks = [b[i * block_bytes:(i + 1) * block_bytes] for i in range(nb)]
    dst = np.empty(block_bytes, np.uint8)
    out = np.empty(block_bytes, np.uint8)
    res = []
    for mid, m in sorted(available_modes().items()):
        encs = []
        total = 0
        for blk in blocks:
            r = m.encode_block(blk, it, isf, dst)
            if 0 <= r < block_bytes:
                encs.append(dst[:r].copy())
                total += r
            else:
                total += block_bytes

        def est():
            for blk in blocks:
                m.estimate_block(blk, it, isf)

        def enc():
            for blk in blocks:
                m.encode_block(blk, it, isf, dst)

        def dec():
            for e in encs:
                m.decode_block(e, it, isf, out)
        n = nb * block_bytes
        row = {"mode": int(mid), "name": m.__name__.rsplit("_", 1)[-1],
               "ratio": n / max(total, 1), "blocks_compressed": len(encs),
               "estimate_GBps": n / best_time(est, repeat) / 1e9,
               "encode_GBps": n / best_time(enc, repeat) / 1e9}
        if encs:
            row["decode_GBps"] = len(encs) * block_bytes / best_time(dec, repeat) / 1e9
        res.append(row)
    return res


def run_blosc2(x, codec, filt, clevel, repeat):
    import blosc2
    blosc2.set_nthreads(1)
    c_ = {"zstd": blosc2.Codec.ZSTD, "lz4": blosc2.Codec.LZ4}[codec]
    f_ = {"shuffle": blosc2.Filter.SHUFFLE, "bitshuffle": blosc2.Filter.BITSHUFFLE}[filt]
    b = x.view(np.uint8)

    def comp():
        return blosc2.compress(b, typesize=x.itemsize, clevel=clevel, filter=f_,
                               codec=c_)
    enc = comp()
    dec = np.empty_like(x)
    blosc2.decompress(enc, dst=dec)
    assert dec.tobytes() == x.tobytes()
    row = {"codec": f"blosc2 {codec}-{clevel} {filt}", "lossless": True,
           "bytes": len(enc), "t_comp": best_time(comp, repeat)}
    row["wall_comp"] = LAST_WALL
    row["t_decomp"] = best_time(lambda: blosc2.decompress(enc, dst=dec), repeat)
    row["wall_decomp"] = LAST_WALL
    return row


def run_zstd(x, level, repeat):
    import zstandard
    cctx = zstandard.ZstdCompressor(level=level, threads=0)
    dctx = zstandard.ZstdDecompressor()
    b = x.view(np.uint8)
    enc = cctx.compress(b)
    assert dctx.decompress(enc) == b.tobytes()
    row = {"codec": f"zstd-{level}", "lossless": True, "bytes": len(enc),
           "t_comp": best_time(lambda: cctx.compress(b), repeat)}
    row["wall_comp"] = LAST_WALL
    row["t_decomp"] = best_time(lambda: dctx.decompress(enc, max_output_size=b.size),
                                repeat)
    row["wall_decomp"] = LAST_WALL
    return row


def run_gpu(name, x, repeat):
    """CUDA-event timings of encode_cuda/decode_cuda (device in and out)."""
    from numba import config, cuda
    if config.ENABLE_CUDASIM or not cuda.is_available():
        return None
    c = _ours(name)
    if c is None:
        return None
    try:
        c.check_dtype(x.dtype)
    except TypeError:
        return None
    stream = cuda.stream()
    d = cuda.to_device(x, stream=stream)
    dout = cuda.device_array(c.max_encoded_size(x.size, x.dtype), np.uint8)
    ddec = cuda.device_array(x.size, x.dtype)
    enc_d = c.encode_cuda(d, dout, stream=stream)
    enc_h = c.encode_cuda(d, stream=stream)            # host result variant
    c.decode_cuda(enc_h, ddec, stream=stream)
    if c.lossless:
        assert ddec.copy_to_host().tobytes() == x.tobytes(), f"{name}: GPU round trip"
    ev0, ev1 = cuda.event(), cuda.event()

    def timed(fn):
        fn()
        best = float("inf")
        for _ in range(repeat):
            ev0.record(stream)
            fn()
            ev1.record(stream)
            ev1.synchronize()
            best = min(best, cuda.event_elapsed_time(ev0, ev1) / 1e3)
        return best
    enc_dev = enc_d  # device-resident encoding for the decode timing
    row = {"codec": name, "lossless": c.lossless, "bytes": int(enc_h.size),
           "t_comp": timed(lambda: c.encode_cuda(d, dout, stream=stream)),
           "t_comp_to_host": timed(lambda: c.encode_cuda(d, stream=stream)),
           "t_decomp": timed(lambda: c.decode_cuda(enc_dev, ddec, stream=stream)),
           "t_decomp_from_host": timed(lambda: c.decode_cuda(enc_h, ddec, stream=stream)),
           "device": cuda.get_current_device().name.decode()
           if isinstance(cuda.get_current_device().name, bytes)
           else str(cuda.get_current_device().name)}
    return row


LOSSY = ("bf16", "int8", "int4")


def bench_kind(kind, nbytes, repeat, gpu=False, verbose=True):
    x = codec_data.make(kind, nbytes)
    rows = []

    def add(r):
        if r is None:
            return
        r["kind"] = kind
        r["dtype"] = str(x.dtype)
        r["nbytes"] = int(x.nbytes)
        r["ratio"] = x.nbytes / r["bytes"]
        r["comp_GBps"] = x.nbytes / r["t_comp"] / 1e9
        r["decomp_GBps"] = x.nbytes / r["t_decomp"] / 1e9
        for k in ("wall_comp", "wall_decomp"):
            if k in r:
                r[k + "_GBps"] = x.nbytes / r[k] / 1e9
        for k in ("t_comp_to_host", "t_decomp_from_host"):
            if k in r:
                r[k.replace("t_", "") + "_GBps"] = x.nbytes / r[k] / 1e9
        rows.append(r)
        if verbose:
            extra = f" rms_err={r['rms_err']:.2e}" if "rms_err" in r else ""
            print(f"{kind:10s} {r['codec']:28s} ratio {r['ratio']:8.3f}  "
                  f"comp {r['comp_GBps']:6.2f} GB/s  decomp {r['decomp_GBps']:6.2f} GB/s"
                  f"{extra}", flush=True)

    add(run_ours("lossless", x, repeat))
    if rows and rows[-1]["codec"] == "lossless":
        rows[-1]["mode_breakdown"] = mode_breakdown(x, max(2, repeat // 2))
        if verbose:
            for m in rows[-1]["mode_breakdown"]:
                print(f"{kind:10s}   mode {m['mode']} {m['name']:6s} alone: ratio "
                      f"{m['ratio']:7.3f}  estimate {m['estimate_GBps']:6.2f}  encode "
                      f"{m['encode_GBps']:6.2f}  decode {m.get('decode_GBps', 0):6.2f} GB/s "
                      f"({m['blocks_compressed']} blocks compressed)", flush=True)
    for name in LOSSY:
        add(run_ours(name, x, repeat))
    # the references are optional (scripts/setup_bench.sh installs them)
    if _have("blosc2"):
        for codec in ("zstd", "lz4"):
            for filt in ("shuffle", "bitshuffle"):
                add(run_blosc2(x, codec, filt, 1, repeat))
    if _have("zstandard"):
        for level in (1, 3):
            add(run_zstd(x, level, repeat))
    if gpu:
        for name in ("lossless",) + LOSSY:
            r = run_gpu(name, x, repeat)
            if r is not None:
                r["codec"] = f"{name} (GPU)"
                r["gpu"] = True
                add(r)
    return rows


def _have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        print(f"{module} not installed: its rows are left out (bash scripts/setup_bench.sh)",
              file=sys.stderr)
        return False


def verdict(rows):
    """Target check per kind: lossless ratio >= 0.97 x blosc2 zstd-1 shuffle,
    >= 1 GB/s compress and decompress."""
    out = {}
    for kind in sorted({r["kind"] for r in rows}):
        ours = [r for r in rows if r["kind"] == kind and r["codec"] == "lossless"]
        ref = [r for r in rows if r["kind"] == kind and r["codec"] == "blosc2 zstd-1 shuffle"]
        if not ours or not ref:
            continue
        o, b = ours[0], ref[0]
        out[kind] = {"ratio_vs_blosc2": o["ratio"] / b["ratio"],
                     "ratio_ok": o["ratio"] >= 0.97 * b["ratio"],
                     "comp_ok": o["comp_GBps"] >= 1.0,
                     "decomp_ok": o["decomp_GBps"] >= 1.0}
    return out


def markdown(rows, meta, verd) -> str:
    lines = [f"Measured by `python -m bench.codecs` on {meta['date']}: "
             f"{meta['size_mib']:g} MiB per kind, one core, best of "
             f"{meta['repeat']} after a warm-up ({meta['cpu']}; numpy "
             f"{meta['numpy']}, numba {meta['numba']}, blosc2 {meta['blosc2']}, "
             f"zstandard {meta['zstandard']}; load average {meta['loadavg']:.1f} "
             f"on {meta['cores']} cores at the end of the run).  GB/s are input "
             f"bytes per second of the calling thread's CPU time (one core's "
             f"work; wall-clock figures, noisier on a shared machine, are in "
             f"the JSON).  GPU rows: CUDA-event time.",
             ""]
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        lines.append(f"**{kind}** ({rs[0]['dtype']})")
        lines.append("")
        lines.append("| codec | ratio | compress GB/s | decompress GB/s | rms error |")
        lines.append("|---|---:|---:|---:|---:|")
        for r in rs:
            err = f"{r['rms_err']:.2e}" if "rms_err" in r else ("exact" if r["lossless"] else "")
            name = r["codec"]
            if "modes" in r:
                name += " (blocks by mode: " + ", ".join(
                    f"{m}:{k}" for m, k in sorted(r["modes"].items())) + ")"
            if r.get("gpu"):
                name += (f" [{r['device']}; to host {r['comp_to_host_GBps']:.1f} / "
                         f"from host {r['decomp_from_host_GBps']:.1f} GB/s]")
            lines.append(f"| {name} | {r['ratio']:.3f} | {r['comp_GBps']:.2f} | "
                         f"{r['decomp_GBps']:.2f} | {err} |")
        lines.append("")
        mb = [r for r in rs if "mode_breakdown" in r]
        if mb:
            lines.append("Lossless modes alone on these blocks (GB/s of block bytes, "
                         "one core; decode over the blocks the mode compresses):")
            lines.append("")
            lines.append("| mode | ratio alone | estimate GB/s | encode GB/s | decode GB/s |")
            lines.append("|---|---:|---:|---:|---:|")
            for m in mb[0]["mode_breakdown"]:
                dec = f"{m['decode_GBps']:.2f}" if "decode_GBps" in m else "-"
                lines.append(f"| {m['mode']} {m['name']} | {m['ratio']:.3f} | "
                             f"{m['estimate_GBps']:.2f} | {m['encode_GBps']:.2f} | {dec} |")
            lines.append("")
    if verd:
        lines.append("Targets (lossless ratio >= 0.97 x blosc2 zstd-1 shuffle; "
                     ">= 1 GB/s compress and decompress per core):")
        lines.append("")
        for kind, v in verd.items():
            lines.append(f"- {kind}: ratio {v['ratio_vs_blosc2']:.3f} x blosc2 "
                         f"({'met' if v['ratio_ok'] else 'NOT met'}); compress "
                         f"{'met' if v['comp_ok'] else 'NOT met'}; decompress "
                         f"{'met' if v['decomp_ok'] else 'NOT met'}")
        lines.append("")
    return "\n".join(lines)


def write_md(path: Path, text: str) -> None:
    if path.exists() and BEGIN in path.read_text():
        old = path.read_text()
        a = old.index(BEGIN) + len(BEGIN)
        b = old.index(END) if END in old else len(old)
        path.write_text(old[:a] + "\n" + text + "\n" + old[b:])
    else:
        path.write_text(text + "\n")


def meta_info(nbytes, repeat):
    import numba
    try:
        import blosc2
        bv = blosc2.__version__
    except ImportError:
        bv = "-"
    try:
        import zstandard
        zv = zstandard.__version__
    except ImportError:
        zv = "-"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%d"), "size_mib": nbytes / 2 ** 20,
            "cores": os.cpu_count(), "loadavg": os.getloadavg()[0],
            "repeat": repeat, "cpu": cpu, "numpy": np.__version__,
            "numba": numba.__version__, "blosc2": bv, "zstandard": zv,
            "python": platform.python_version()}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.codecs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="16MiB", help="bytes per data kind (default 16MiB)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs, best taken")
    ap.add_argument("--kinds", default=",".join(sorted(codec_data.KINDS)))
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--md", help="write markdown tables (docs/codecs.md: its Measured section)")
    ap.add_argument("--gpu", action="store_true", help="also time the CUDA path (real GPU only)")
    a = ap.parse_args(argv)
    nbytes = parse_size(a.size)
    if a.gpu:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    rows = []
    for kind in a.kinds.split(","):
        rows += bench_kind(kind.strip(), nbytes, a.repeat, gpu=a.gpu)
    if a.gpu and not any(r.get("gpu") for r in rows):
        print("[codecs] --gpu: no real GPU (or the CUDA simulator is on): GPU rows skipped",
              file=sys.stderr)
    meta = meta_info(nbytes, a.repeat)
    verd = verdict(rows)
    for kind, v in verd.items():
        print(f"target {kind}: ratio {v['ratio_vs_blosc2']:.3f} x blosc2 "
              f"{'ok' if v['ratio_ok'] else 'MISSED'}, comp {'ok' if v['comp_ok'] else 'MISSED'}, "
              f"decomp {'ok' if v['decomp_ok'] else 'MISSED'}")
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows, "targets": verd},
                                           indent=1) + "\n")
    if a.md:
        write_md(Path(a.md), markdown(rows, meta, verd))
    return rows


if __name__ == "__main__":
    main()
