"""Build the Cython runtime of spfuse.

Every ``spfuse/_kernels/*.pyx`` becomes one extension module.  OpenMP is used
when the compiler that will build us can compile *and run* an OpenMP program;
otherwise the kernels are built serially and ``spfuse.show_config()`` says so.
Developers rebuild one module with
``SPFUSE_ONLY=_name python setup.py build_ext --inplace``.  Set
``SPFUSE_FAIL_NO_OPENMP=1`` to turn the serial fallback into an error and
``SPFUSE_DEBUG=1`` to build with Cython bounds checks for debugging.

On x86-64 (gcc or clang) each ``*_avx2.pyx`` -- a compute module included
whole -- is built a second time with ``-mavx2``; ``spfuse._kernels`` loads
that build on a CPU with AVX2 (see its docstring).  Floating-point
contraction is off in every build, so the two give bitwise equal results.
"""
import glob
import os
import platform
import subprocess
import sys
import tempfile
import textwrap

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        #pragma omp parallel
        printf("thread %d\\n", omp_get_thread_num());
        return 0;
    }
    """
)


def _openmp_flags(compiler):
    """Return (compile, link) flags if ``compiler`` builds and runs OpenMP code."""
    if sys.platform == "win32":
        candidates = [(["/openmp"], [])]
    elif sys.platform == "darwin":
        candidates = [(["-Xpreprocessor", "-fopenmp"], ["-lomp"])]
    else:
        candidates = [(["-fopenmp"], ["-fopenmp"])]
    for cflags, lflags in candidates:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write(OPENMP_PROBE)
            try:
                objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
                exe = os.path.join(tmp, "probe")
                compiler.link_executable(objs, exe, extra_postargs=lflags)
                out = subprocess.run([exe], capture_output=True, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "2"}, timeout=60)
            except Exception:  # noqa: BLE001 - any failure means "no OpenMP"
                continue
            if out.returncode == 0 and out.stdout.count("thread") == 2:
                return cflags, lflags
    return None


class BuildExtWithOpenMP(build_ext):
    def build_extensions(self):
        flags = _openmp_flags(self.compiler)
        if flags is None:
            if os.environ.get("SPFUSE_FAIL_NO_OPENMP"):
                raise RuntimeError("SPFUSE_FAIL_NO_OPENMP is set and the compiler cannot build OpenMP code")
            print("*" * 72 + "\nWARNING: spfuse is built WITHOUT OpenMP: kernels run on one thread.\n" + "*" * 72)
        for ext in self.extensions:
            if flags is not None:
                ext.extra_compile_args += flags[0]
                ext.extra_link_args += flags[1]
                ext.define_macros.append(("SPFUSE_BUILT_WITH_OPENMP", "1"))
        super().build_extensions()


def extensions():
    debug = bool(os.environ.get("SPFUSE_DEBUG"))
    compile_args = ["-O0", "-g"] if debug else ["-O3"]
    if sys.platform == "win32":
        compile_args = ["/O2"]
    else:
        compile_args.append("-ffp-contract=off")  # no fused multiply-add: the same sums on every CPU
        # nothing reads the FP exception flags: a select between two values
        # (x / y where x != 0, else 0) may then be if-converted and vectorised
        # (the same IEEE results; gcc keeps such loops scalar by default)
        compile_args.append("-fno-trapping-math")
        # Python's own CFLAGS carry -fwrapv (CPython's C relies on signed
        # wrap-around; no kernel here does).  With it gcc must keep an int32
        # loop index's 32-bit wrap, which costs the scatter loops ~12%
        # (spmv_t, 1M entries: 1.75 -> 1.53 ms); meson builds of scipy and
        # scikit-learn compile their Cython without it too.
        compile_args.append("-fno-wrapv")
    # the AVX2 builds: x86-64 with gcc/clang, not the debug build
    avx2 = not debug and sys.platform != "win32" and platform.machine().lower() in ("x86_64", "amd64")
    # SPFUSE_ONLY=_spmm,_config builds just those modules (for developers
    # iterating on one kernel file while others are half-written); a
    # module's AVX2 build comes with it.
    only = {m for m in os.environ.get("SPFUSE_ONLY", "").split(",") if m}
    exts = []
    for pyx in sorted(glob.glob(os.path.join("spfuse", "_kernels", "*.pyx"))):
        name = pyx[:-4].replace(os.sep, ".")
        isa_build = name.endswith("_avx2")
        if isa_build and not avx2:
            continue
        if only and name.rsplit(".", 1)[-1].removesuffix("_avx2") not in only:
            continue
        exts.append(Extension(
            name, [pyx],
            include_dirs=[numpy.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=list(compile_args) + (["-mavx2"] if isa_build else []),
            extra_link_args=[],
        ))
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": False,
        "initializedcheck": debug,
        "cdivision": True,
        "nonecheck": False,
        "embedsignature": True,
    }
    return cythonize(exts, compiler_directives=directives, nthreads=os.cpu_count() or 1)


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExtWithOpenMP})
