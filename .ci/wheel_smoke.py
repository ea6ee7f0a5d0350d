"""Smoke test of an installed spfuse wheel, run where no C compiler can be found.

Run by ``.ci/run`` (wheel step) with the wheel installed into a fresh venv
whose PATH holds no ``cc``/``gcc``/``clang``: the wheel must carry its
compiled kernels and need nothing at run time.  Checks: the import comes
from the venv (not a source tree), no compiler is reachable, the package
data is there, and SpMV, SDDMM, an off-catalogue program and an einsum
match numpy; ``show_config()`` prints.
"""
import os
import shutil
import sys
import sysconfig

import numpy as np
import scipy.sparse as sp

import spfuse

for tool in ("cc", "gcc", "clang", "c++", "g++"):
    assert shutil.which(tool) is None, f"a C compiler is reachable ({shutil.which(tool)}): the test proves nothing"
site = os.path.realpath(sysconfig.get_paths()["purelib"])
where = os.path.realpath(spfuse.__file__)
assert where.startswith(site + os.sep), f"spfuse imported from {where}, not from the venv's {site}"
package = os.path.dirname(where)
assert os.path.exists(os.path.join(package, "py.typed")), "py.typed missing from the wheel"
compiled = [f for f in os.listdir(os.path.join(package, "_kernels")) if f.endswith((".so", ".pyd"))]
assert len(compiled) >= 5, f"compiled kernels missing from the wheel: {compiled}"

rng = np.random.default_rng(0)
A = sp.random_array((300, 200), density=0.05, format="csr", rng=rng)
x = rng.standard_normal(200)
np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x), A @ x, rtol=1e-12, atol=1e-12)

C, D = rng.standard_normal((300, 8)), rng.standard_normal((8, 200))
got = spfuse.evaluate("S[i,j] = A[i,j] * (C[i,k] * D[k,j])", A=A, C=C, D=D)
np.testing.assert_allclose(got.toarray(), A.toarray() * (C @ D), rtol=1e-12, atol=1e-12)

W = rng.standard_normal((200, 5))
got = spfuse.evaluate("Z[i,h] = relu(A[i,j] * W[j,h]) * 2 + abs(C[i,h])", A=A, W=W, C=C[:, :5])
np.testing.assert_allclose(got, np.maximum(A @ W, 0) * 2 + np.abs(C[:, :5]), rtol=1e-12, atol=1e-12)

X = rng.standard_normal((2, 3, 200))
np.testing.assert_allclose(spfuse.einsum("...j,ij->...i", X, A), X @ A.toarray().T, rtol=1e-12, atol=1e-12)

spfuse.show_config()
print(f"wheel smoke test passed ({len(compiled)} compiled modules, python {sys.version.split()[0]})")
