"""Builds the optional C++ kernels - PAP's (src/kpca_attention/pap/csrc), robust KDE attention's and
PIDformer's (src/kpca_attention/attention/csrc) - into one extension; everything else is in pyproject.toml.

The extension is optional: without a C++ compiler, on a CPU other than x86-64, or where torch cannot be
imported at build time (pip's build isolation: install with ``--no-build-isolation``, as the Makefile
does), the package installs without it and PAP runs its eager ops (kpca_attention/pap/kernels.py).
"""

import os
import platform
import sys
import traceback

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
        class BuildSideBySide(BuildExtension.with_options(use_ninja=False)):
            """torch's BuildExtension, building the extensions side by side: each after the first in a
            forked child process with its own build folder (the two builds compile the same sources, and
            distutils builds one extension after the other: ~2 minutes each on a 2-core VM). A child that
            fails is an optional extension's failure, a warning, as in the serial build."""

            def _build_extensions_serial(self):
                if not hasattr(os, "fork") or len(self.extensions) < 2:
                    return super()._build_extensions_serial()
                from setuptools.errors import CompileError

                children = []
                for ext in self.extensions[1:]:
                    pid = os.fork()
                    if pid == 0:  # the child: its own object files, then its build's status
                        status = 1
                        try:
                            self.build_temp = os.path.join(self.build_temp, ext.name)
                            self.build_extension(ext)
                            status = 0
                        except BaseException:
                            traceback.print_exc()
                        finally:
                            sys.stdout.flush()
                            sys.stderr.flush()
                            os._exit(status)
                    children.append((ext, pid))
                first = self.extensions[0]
                with self._filter_build_errors(first):
                    self.build_extension(first)
                for ext, pid in children:
                    status = os.waitpid(pid, 0)[1]
                    if status != 0:
                        with self._filter_build_errors(ext):
                            raise CompileError(f"building {ext.name} failed (wait status {status})")

        cmdclass = {"build_ext": BuildSideBySide}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
