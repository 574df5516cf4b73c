"""Builds the optional C++ kernels - PAP's (src/kpca_attention/pap/csrc), robust KDE attention's and
PIDformer's (src/kpca_attention/attention/csrc) - into one extension; everything else is in pyproject.toml.

The extension is optional: without a C++ compiler, on a CPU other than x86-64, or where torch cannot be
imported at build time (pip's build isolation: install with ``--no-build-isolation``, as the Makefile
does), the package installs without it and PAP runs its eager ops (kpca_attention/pap/kernels.py).
"""

import os
import platform

from setuptools import setup

#: one extension, the project's CPU kernels: PAP's, robust KDE attention's and PIDformer's (fragments of one library)
SOURCES = ["src/kpca_attention/pap/csrc/pap_kernels.cpp", "src/kpca_attention/attention/csrc/rkde_kernels.cpp",
           "src/kpca_attention/attention/csrc/pid_kernels.cpp"]
ext_modules, cmdclass = [], {}
x86 = platform.machine().lower() in ("x86_64", "amd64")
if x86 and os.environ.get("KPCA_ATTENTION_BUILD_KERNELS", "1") != "0":
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        pass
    else:
        # one source, two builds (ATen's own scheme): AVX2 + FMA, and AVX512 where torch's kernels use it
        # (on Intel Xeons, 512-bit vectors run the exp twice as fast as 256-bit ones; kernels.py loads one)
        flags = {"cpu_kernels": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
                 "cpu_kernels_avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                                        "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]}
        # -fopenmp: at::parallel_for is an inline template that runs its loop as an OpenMP region only where
        # the including code is compiled with OpenMP; without it every "parallel" kernel ran on one thread
        # whatever torch's thread count (PAP's 2-thread forward scaled 1.3x, not 1.7x, on a Xeon:
        # docs/benchmarks.md). Linked with -fopenmp, the kernels take the libgomp torch has loaded (one
        # soname, one copy in the process).
        for name, isa in flags.items():
            ext = CppExtension(f"kpca_attention.pap.{name}", SOURCES,
                               extra_compile_args=["-O3", "-fopenmp", *isa], extra_link_args=["-fopenmp"],
                               depends=["src/kpca_attention/pap/csrc/parallel.h"])
            ext.optional = True  # a compiler error is a warning: the eager ops run instead
            ext_modules.append(ext)
        # without ninja, a compiler error is distutils' CompileError, which an optional extension tolerates
        cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=False)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
