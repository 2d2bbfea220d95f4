"""cffi out-of-line API-mode builder for the engine: the one place holding the cdef."""
import glob
import os
import re
import shlex
import subprocess

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
PKGS = ["libngtcp2", "libngtcp2_crypto_gnutls", "gnutls"]


def _pkgconfig(flag, pkgs=PKGS):
    try:
        out = subprocess.check_output(["pkg-config", flag] + pkgs, text=True,
                                      stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        return []
    return shlex.split(out)


def have_dpdk():
    """libdpdk's pkg-config file is there (Debian: libdpdk-dev); ERDMA_WITH_DPDK=0 skips it."""
    if os.environ.get("ERDMA_WITH_DPDK", "") == "0":
        return False
    return subprocess.call(["pkg-config", "--exists", "libdpdk"], stderr=subprocess.DEVNULL) == 0


def _rel(path):
    # setuptools wants source paths relative to setup.py's directory
    return os.path.relpath(path, os.path.dirname(HERE))


def cdef_from_header(path):
    """The cdef is the public header itself, minus comments and preprocessor
    lines; value macros become `...` so the compiler supplies them."""
    with open(path) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    lines = []
    for line in text.splitlines():
        words = line.split(None, 2)
        if words and words[0] == "#define":
            if len(words) == 3 and not words[2].startswith('"'):
                lines.append("#define %s ..." % words[1])
        elif not line.lstrip().startswith("#"):
            lines.append(line)
    return "\n".join(lines)


DPDK_SOURCE = "erdma_pktio_dpdk.c"
# a header change rebuilds both modules: the DPDK plugin refuses an engine
# whose struct layout differs from the one it was built with
HEADERS = [_rel(p) for p in sorted(glob.glob(os.path.join(HERE, "src", "*.h"))
                                   + glob.glob(os.path.join(HERE, "include", "*.h")))]

ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header(os.path.join(HERE, "include", "erdma.h")))

ffibuilder.set_source(
    "_erdma",
    '#include "erdma.h"',
    sources=[_rel(p) for p in sorted(glob.glob(os.path.join(HERE, "src", "*.c")))
             if os.path.basename(p) != DPDK_SOURCE],
    include_dirs=[_rel(os.path.join(HERE, "include")), _rel(os.path.join(HERE, "src"))],
    depends=HEADERS,
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function"]
    + [f for f in _pkgconfig("--cflags")],
    extra_link_args=_pkgconfig("--libs") + ["-lpthread"],
)



def dpdk_ffibuilder():
    """The DPDK packet I/O backend, a module of its own (erdmampi._erdma_dpdk)
    that the engine dlopens only when a rank selects pktio="dpdk": DPDK's
    ~60 libraries (and their load-time constructors) stay out of
    `import erdmampi`, and the main module still loads where the DPDK
    libraries are absent.  Without libdpdk it is a stub whose
    erdma_dpdk_built() returns 0, so selecting dpdk says how to get it."""
    ffi = FFI()
    ffi.cdef("int erdma_dpdk_built(void);")
    dpdk = have_dpdk()
    cflags = ["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function"] + _pkgconfig("--cflags")
    libs = []
    if dpdk:
        # libdpdk's cflags carry -include rte_config.h and -march=corei7
        cflags += ["-DERDMA_HAVE_DPDK=1"] + _pkgconfig("--cflags", ["libdpdk"])
        libs = _pkgconfig("--libs", ["libdpdk"])
    ffi.set_source(
        "_erdma_dpdk",
        "int erdma_dpdk_built(void);",
        sources=[_rel(os.path.join(HERE, "src", DPDK_SOURCE))],
        include_dirs=[_rel(os.path.join(HERE, "include")), _rel(os.path.join(HERE, "src"))],
        depends=HEADERS,
        extra_compile_args=cflags,
        extra_link_args=libs,
    )
    return ffi


if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
