# Row epilogues: element-wise operations applied to each row segment of a
# kernel's result while it is in cache (SpMM and SpMV in _csr_kernels, the
# row blocks of gemm in _dense_kernels), written once.  A program is
# ``(code, kinds, refs, consts, n_regs, out_reg)``; lowering/epilogues.py
# builds it and names the operations and argument kinds through
# ``_csr_kernels.EPILOGUE_OPS`` and ``EPILOGUE_ARGS``.
from libc.math cimport fabs, sqrt
from libc.stdint cimport int64_t

cdef enum:
    EPI_COPY, EPI_ADD, EPI_SUB, EPI_MUL, EPI_DIV, EPI_RELU, EPI_NEG, EPI_ABS, EPI_SQRT, EPI_ROUND, EPI_WHERE
cdef enum:   # argument kinds
    EPI_REG, EPI_CONST, EPI_ROW, EPI_COL, EPI_MATRIX

cdef struct _Epilogue:
    Py_ssize_t n_ops       # instructions: (opcode, destination register, first argument, argument count)
    Py_ssize_t n_regs      # registers, each one row segment; register 0 starts as the product's
    const int64_t* code
    const int64_t* kinds   # per argument: EPI_REG .. EPI_MATRIX
    const int64_t* refs    # per argument: a register number, or the address of a float64 array
    const double* consts   # per argument: the constant, or the argument's coefficient
    Py_ssize_t out_reg


cdef inline object _epilogue_from(object epilogue, _Epilogue* e):
    """Fill ``e`` from ``(code, kinds, refs, consts, n_regs, out_reg)`` (int64,
    int64, int64, float64 arrays); returns what keeps the arrays alive."""
    code, kinds, refs, consts, n_regs, out_reg = epilogue
    cdef const int64_t[::1] c = code
    cdef const int64_t[::1] k = kinds
    cdef const int64_t[::1] r = refs
    cdef const double[::1] v = consts
    cdef Py_ssize_t t, a
    if c.shape[0] % 4 or k.shape[0] != r.shape[0] or k.shape[0] != v.shape[0] or not 0 <= out_reg < n_regs:
        raise ValueError("epilogue: malformed program")
    for t in range(0, c.shape[0], 4):   # instructions run argument by argument over their destination
        if not (0 <= c[t + 1] < n_regs and c[t + 3] >= 1 and 0 <= c[t + 2] and c[t + 2] + c[t + 3] <= k.shape[0]):
            raise ValueError("epilogue: malformed program")
        for a in range(c[t + 2], c[t + 2] + c[t + 3]):
            if k[a] == EPI_REG and (not 0 <= r[a] < n_regs or (a > c[t + 2] and r[a] == c[t + 1])):
                raise ValueError("epilogue: an instruction's destination is one of its later arguments")
    e.n_ops = c.shape[0] // 4
    e.n_regs = n_regs
    e.code = &c[0] if c.shape[0] else NULL
    e.kinds = &k[0] if k.shape[0] else NULL
    e.refs = &r[0] if r.shape[0] else NULL
    e.consts = &v[0] if v.shape[0] else NULL
    e.out_reg = out_reg
    return (c, k, r, v)


cdef inline const double* _epi_operand(const _Epilogue* e, Py_ssize_t a, double* regs, Py_ssize_t kw,
                                       Py_ssize_t i, Py_ssize_t k0, Py_ssize_t K, bint* along) noexcept nogil:
    """Where argument ``a`` of the segment ``[k0, k0 + kw)`` of row ``i``
    lies: ``along`` set, ``kw`` contiguous doubles; else one double that
    holds for the whole segment (a constant, ``v[i]``)."""
    cdef int64_t kind = e.kinds[a]
    along[0] = kind != EPI_CONST and kind != EPI_ROW
    if kind == EPI_REG:
        return regs + e.refs[a] * kw
    if kind == EPI_CONST:
        return &e.consts[a]
    if kind == EPI_ROW:
        return (<const double*><size_t>e.refs[a]) + i
    if kind == EPI_COL:
        return (<const double*><size_t>e.refs[a]) + k0
    return (<const double*><size_t>e.refs[a]) + i * K + k0


cdef inline double _epi_coefficient(const _Epilogue* e, Py_ssize_t a) noexcept nogil:
    return 1.0 if e.kinds[a] == EPI_CONST else e.consts[a]   # (a constant holds its value there)


cdef inline void _epi_combine(int64_t op, double* dst, const double* p, bint along, double c,
                              Py_ssize_t kw) noexcept nogil:
    """``dst = dst (op) c * p`` over the segment (one pass, vectorised; ``p``
    one double when not ``along``)."""
    cdef Py_ssize_t k
    cdef double x = p[0] * c, q
    if op == EPI_ADD:
        if along:
            for k in range(kw):
                dst[k] = dst[k] + p[k] * c
        else:
            for k in range(kw):
                dst[k] = dst[k] + x
    elif op == EPI_SUB:
        if along:
            for k in range(kw):
                dst[k] = dst[k] - p[k] * c
        else:
            for k in range(kw):
                dst[k] = dst[k] - x
    elif op == EPI_MUL:
        if along:
            for k in range(kw):
                dst[k] = dst[k] * p[k]
        else:
            for k in range(kw):
                dst[k] = dst[k] * x
    else:   # EPI_DIV: a / b is 0 where a is (numpy's masked division)
        for k in range(kw):
            q = dst[k] / (p[k] if along else x)   # (computed either way: the select vectorises)
            dst[k] = 0.0 if dst[k] == 0.0 else q


cdef inline void _epi_unary(int64_t op, double* dst, Py_ssize_t kw) noexcept nogil:
    cdef Py_ssize_t k
    if op == EPI_RELU:
        for k in range(kw):
            dst[k] = dst[k] if dst[k] > 0.0 else 0.0
    elif op == EPI_NEG:
        for k in range(kw):
            dst[k] = -dst[k]
    elif op == EPI_ABS:
        for k in range(kw):
            dst[k] = fabs(dst[k])
    elif op == EPI_SQRT:
        for k in range(kw):
            dst[k] = sqrt(dst[k])
    elif op == EPI_ROUND:
        for k in range(kw):
            dst[k] = <double><float>dst[k]


cdef inline void _run_epilogue(const _Epilogue* e, double* regs, Py_ssize_t kw, Py_ssize_t i, Py_ssize_t k0,
                        Py_ssize_t K) noexcept nogil:
    """The epilogue over one segment ``[k0, k0 + kw)`` of row ``i`` (``K``
    columns): ``regs`` holds ``n_regs`` rows of ``kw`` doubles, register 0
    the product's segment.  Each instruction is a few passes over the
    segment, one per argument (the argument's kind is looked at once per
    segment, not per element, so the loops vectorise).  The arithmetic is
    numpy's on float64 arrays, operation by operation (a linear
    combination ``c0*x0 + x1 + c2*x2`` left to right; ``a / b`` is 0 where
    ``a`` is; ``relu`` is ``x`` where ``x > 0``, else +0.0; ``where(c, a,
    b)`` is ``a`` where ``c != 0`` -- NaN included -- else ``b``).  An
    instruction's destination is never one of its arguments after the
    first (:func:`_epilogue_from` checks)."""
    cdef Py_ssize_t t, a, a0, na, k
    cdef int64_t op
    cdef double* dst
    cdef const double* p
    cdef const double* q
    cdef const double* r
    cdef double x, c
    cdef bint along, along_q, along_r
    for t in range(e.n_ops):
        op = e.code[4 * t]
        dst = regs + e.code[4 * t + 1] * kw
        a0 = e.code[4 * t + 2]
        na = e.code[4 * t + 3]
        if op == EPI_WHERE and na == 3:   # (elementwise: dst may be the condition's register)
            p = _epi_operand(e, a0, regs, kw, i, k0, K, &along)
            q = _epi_operand(e, a0 + 1, regs, kw, i, k0, K, &along_q)
            r = _epi_operand(e, a0 + 2, regs, kw, i, k0, K, &along_r)
            for k in range(kw):
                dst[k] = (q[k] if along_q else q[0]) if (p[k] if along else p[0]) != 0.0 else \
                    (r[k] if along_r else r[0])
            continue
        # the first argument, times its coefficient in a linear combination
        # (1.0 for the other operations: x * 1.0 is x, bit for bit)
        p = _epi_operand(e, a0, regs, kw, i, k0, K, &along)
        c = _epi_coefficient(e, a0)
        if along:
            for k in range(kw):
                dst[k] = p[k] * c
        else:
            x = p[0] * c
            for k in range(kw):
                dst[k] = x
        if na == 1:
            _epi_unary(op, dst, kw)
        for a in range(a0 + 1, a0 + na):
            p = _epi_operand(e, a, regs, kw, i, k0, K, &along)
            _epi_combine(op, dst, p, along, _epi_coefficient(e, a), kw)


