"""Build erdmampi: the cffi engine (ext/), the Python package and erdmarun."""
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup

REQUIRED_PKGCONFIG = {
    "libngtcp2": "libngtcp2-dev",
    "libngtcp2_crypto_gnutls": "libngtcp2-crypto-gnutls-dev",
    "gnutls": "libgnutls28-dev",
}


def check_system_libraries():
    """Fail early, naming the Debian packages, when the C libraries are missing."""
    if shutil.which("pkg-config") is None:
        sys.exit("erdmampi: pkg-config not found. Install it: apt-get install -y pkg-config "
                 + " ".join(REQUIRED_PKGCONFIG.values()))
    missing = [deb for pc, deb in REQUIRED_PKGCONFIG.items()
               if subprocess.call(["pkg-config", "--exists", pc]) != 0]
    if missing:
        sys.exit("erdmampi: missing C libraries. Install them: apt-get install -y "
                 + " ".join(missing))


def packages():
    """Every package under erdmampi/, plus kernels/ and launcher/ installed as
    erdmampi.kernels and erdmampi.launcher: discovered, so a new subpackage
    cannot be left out of a wheel."""
    found = ["erdmampi"] + ["erdmampi." + p for p in find_packages("erdmampi")]
    for top in ("kernels", "launcher"):
        found += ["erdmampi." + top] + [f"erdmampi.{top}.{p}" for p in find_packages(top)]
    return found


if not any(a in sys.argv for a in ("egg_info", "dist_info", "--help", "clean", "sdist")):
    check_system_libraries()

setup(
    name="erdmampi",
    version="0.1.0",
    description="MPI for GPUs across the Internet: mpi4py-compatible API over QUIC",
    python_requires=">=3.11",
    packages=packages(),
    package_dir={"erdmampi.kernels": "kernels", "erdmampi.launcher": "launcher"},
    # the WAN test bed compiles its delay line from source on first use
    package_data={"erdmampi.testing": ["*.c"]},
    setup_requires=["cffi>=1.15"],
    # numba: the compression codecs (kernels/), used by default across hosts
    install_requires=["cffi>=1.15", "numpy", "cryptography", "numba"],
    # erdmampi.torch, the torch.distributed backend "erdma"
    extras_require={"torch": ["torch"]},
    cffi_modules=["ext/build_engine.py:ffibuilder", "ext/build_engine.py:dpdk_ffibuilder"],
    ext_package="erdmampi",
    # MPI.buffer: a C type because it must export the buffer protocol; on the
    # 3.11 limited API, so one _membuf.abi3.so serves 3.11 and later
    ext_modules=[Extension("_membuf", ["ext/python/membuf.c"],
                           py_limited_api=True,
                           define_macros=[("Py_LIMITED_API", "0x030B0000")],
                           extra_compile_args=["-O2", "-Wall"])],
    entry_points={"console_scripts": ["erdmarun=erdmampi.launcher.cli:main"]},
    # every extension is abi3 (cffi's and _membuf), so the wheel is tagged
    # cp311-abi3 and installs on any later Python too
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if sys.version_info >= (3, 11) else {},
    zip_safe=False,
)
