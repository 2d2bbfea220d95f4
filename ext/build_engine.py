"""cffi out-of-line API-mode builder for the engine: the one place holding the cdef."""
import glob
import os
import re
import shlex
import subprocess

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
PKGS = ["libngtcp2", "libngtcp2_crypto_gnutls", "gnutls"]


def _pkgconfig(flag):
    try:
        out = subprocess.check_output(["pkg-config", flag] + PKGS, text=True)
    except (OSError, subprocess.CalledProcessError):
        return []
    return shlex.split(out)


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


ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header(os.path.join(HERE, "include", "erdma.h")))

ffibuilder.set_source(
    "_erdma",
    '#include "erdma.h"',
    sources=[_rel(p) for p in sorted(glob.glob(os.path.join(HERE, "src", "*.c")))],
    include_dirs=[_rel(os.path.join(HERE, "include")), _rel(os.path.join(HERE, "src"))],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function"]
    + [f for f in _pkgconfig("--cflags")],
    extra_link_args=_pkgconfig("--libs") + ["-lpthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
