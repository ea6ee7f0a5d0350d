
from libc.stdint cimport int64_t, intptr_t, uint64_t, INT64_MAX
from libc.stdlib cimport malloc, calloc, realloc, free
from libc.string cimport memcpy
from libc.math cimport log, tanh, sqrt, fabs
from cython.parallel cimport parallel
cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_New
import numpy as np

from spfuse._kernels._bitmap cimport _bitmap_readback
from spfuse._kernels._leaves cimport _dot, _gather_dot4, _prefetch_row, _sum4, spfuse_exp, spfuse_sigmoid
from spfuse._kernels._interrupt cimport (
    PyErr_CheckSignals, spfuse_chunk_work, spfuse_set_chunk_work,
)
from spfuse._kernels._openmp_helpers cimport omp_get_thread_num, omp_get_num_threads
from spfuse._kernels._workspace cimport padded_stride

cnp.import_array()

# -- the plan encoding (spfuse/runtime/looptree.py reads it from PLAN_CODES) --
cdef enum:
    N_LOOP = 0
    N_STMT = 1
    N_RESET = 2
    N_FLUSH = 3

    M_DENSE = 0
    M_INTERSECT = 1
    M_UNION = 2

    L_DENSE = 0
    L_COMPRESSED = 1

    T_BUF = 0
    T_PATTERN = 1
    T_COO = 2
    T_WS = 3

    A_ASSIGN = 0
    A_SUM = 1
    A_MAX = 2
    A_MIN = 3

    OP_LOAD_ACC = 0
    OP_LOAD_BUF = 1
    OP_CONST = 2
    OP_ADD = 10
    OP_SUB = 11
    OP_MUL = 12
    OP_DIV = 13
    OP_MAX = 14
    OP_MIN = 15
    OP_LT = 16
    OP_LE = 17
    OP_GT = 18
    OP_GE = 19
    OP_EQ = 20
    OP_NE = 21
    OP_WHERE = 30
    OP_NEG = 40
    OP_ABS = 41
    OP_SQRT = 42
    OP_EXP = 43
    OP_LOG = 44
    OP_TANH = 45
    OP_SIGMOID = 46
    OP_RELU = 47

    STACK_SIZE = 64
    BLK = 256
    PREFETCH_AHEAD = 4

    # dense leaves of a sweep's fiber loop (loop_leaf)
    LEAF_DOT = 1
    LEAF_AXPY = 2
    LEAF_GDOT = 3
    LEAF_IDOT = 4
    LEAF_SAXPY = 5

    # how a top-level loop runs over threads (top_parallel)
    PAR_ROWS = 1      # static blocks of iterations, one per thread
    PAR_REDUCE = 2    # fixed reduction blocks into private partial sums (buf_reduce)

    # how a loop runs as a sweep (loop_sweep)
    SWEEP_ROWS = 1
    SWEEP_FIBER = 2
    SW = 512

    # template-kernel work units (_interrupt.pxd) per interpreter unit (a
    # loop iteration: ~5-10 ns)
    LT_UNIT = 4
    # growth bound of consecutive top-level chunks
    LT_GROWTH = 8

STACK_LIMIT = STACK_SIZE

#: The plan encoding's codes, by name: the one source the plan builder
#: (:mod:`spfuse.runtime.looptree`) takes them from.
PLAN_CODES = {
    "N_LOOP": N_LOOP, "N_STMT": N_STMT, "N_RESET": N_RESET, "N_FLUSH": N_FLUSH,
    "M_DENSE": M_DENSE, "M_INTERSECT": M_INTERSECT, "M_UNION": M_UNION,
    "L_DENSE": L_DENSE, "L_COMPRESSED": L_COMPRESSED,
    "T_BUF": T_BUF, "T_PATTERN": T_PATTERN, "T_COO": T_COO, "T_WS": T_WS,
    "A_ASSIGN": A_ASSIGN, "A_SUM": A_SUM, "A_MAX": A_MAX, "A_MIN": A_MIN,
    "OP_LOAD_ACC": OP_LOAD_ACC, "OP_LOAD_BUF": OP_LOAD_BUF, "OP_CONST": OP_CONST,
    "OP_ADD": OP_ADD, "OP_SUB": OP_SUB, "OP_MUL": OP_MUL, "OP_DIV": OP_DIV,
    "OP_MAX": OP_MAX, "OP_MIN": OP_MIN, "OP_LT": OP_LT, "OP_LE": OP_LE, "OP_GT": OP_GT,
    "OP_GE": OP_GE, "OP_EQ": OP_EQ, "OP_NE": OP_NE, "OP_WHERE": OP_WHERE,
    "OP_NEG": OP_NEG, "OP_ABS": OP_ABS, "OP_SQRT": OP_SQRT, "OP_EXP": OP_EXP, "OP_LOG": OP_LOG,
    "OP_TANH": OP_TANH, "OP_SIGMOID": OP_SIGMOID, "OP_RELU": OP_RELU,
    "STACK_SIZE": STACK_SIZE, "PAR_ROWS": PAR_ROWS, "PAR_REDUCE": PAR_REDUCE,
}


ctypedef struct Plan:
    int64_t* node_kind
    int64_t* node_end
    int64_t* node_arg
    int64_t* loop_var
    int64_t* loop_mode
    int64_t* loop_lev_start
    int64_t* loop_ndrv
    int64_t* loop_nlev
    int64_t* loop_levs
    int64_t* loop_block
    int64_t* loop_fiber
    int64_t* loop_sweep
    int64_t* buf_rslot
    int64_t* buf_postemp
    int64_t* loop_leaf
    int64_t* var_extent
    int64_t* lev_kind
    int64_t* lev_size
    int64_t* lev_parent
    idx_t** lev_pos
    idx_t** lev_crd
    int64_t* acc_last
    double** acc_vals
    int64_t* bref_buf
    int64_t* bref_tstart
    int64_t* bref_nterm
    int64_t* term_var
    int64_t* term_stride
    int64_t* stmt_tkind
    int64_t* stmt_target
    int64_t* stmt_op
    int64_t* stmt_cstart
    int64_t* stmt_clen
    int64_t* pat_buf
    int64_t* pat_level
    int64_t* coo_nvar
    int64_t* coo_vstart
    int64_t* coo_vars
    int64_t* ws_buf     # per row workspace: its private buffer, COO output, extent
    int64_t* ws_coo
    int64_t* ws_extent
    int64_t* ws_pos     # the workspace variable's position among its output's
    int64_t* buf_ws     # per buffer: the workspace it is, or -1
    int64_t* reset_buf
    int64_t* reset_whole
    int64_t* reset_tstart
    int64_t* reset_nbound
    int64_t* reset_nfree
    int64_t* rterm_a
    int64_t* rterm_b
    double* reset_value
    int64_t* buf_size
    int64_t* code
    double* consts


ctypedef struct WsOut:
    # what a row workspace's flushes emitted: the workspace coordinates and
    # values, in order, and one record per flush (the output's other
    # variables, then the number of entries) -- rows, not a coordinate per entry
    int64_t* k
    double* v
    int64_t n
    int64_t cap
    int64_t* rec
    int64_t rn
    int64_t rcap


ctypedef struct Ctx:
    int64_t* ival      # current value of each loop variable
    int64_t* curpos    # current position of each level (-1 = absent)
    int64_t* cur       # seek cursor of each level (compressed) / merge cursor
    int64_t* cend      # end of the level's current segment
    int64_t* base      # dense level: parent*size, -1 if the parent is absent
    int64_t* odo       # odometer scratch for RESET regions
    double** buf       # buffer data pointers (thread-private copies differ)
    int64_t** coo_crd
    double** coo_val
    int64_t* coo_n
    int64_t* coo_cap
    uint64_t** ws_bits   # per workspace: a bit per coordinate touched since the last flush
    uint64_t** ws_words  # ... and a summary bit per 64-coordinate word of ws_bits
    int64_t* ws_lo       # per workspace: the range of summary words in use (-1: none)
    int64_t* ws_hi
    WsOut* wso
    int64_t* blk_i     # block mode: coordinates of up to BLK iterations
    int64_t* blk_pos   # block mode: positions, one row of BLK per loop level
    double* vst        # block mode: vector stack, one row of BLK per slot
    int64_t* sw_rowid  # sweeps: a chunk's row segments (SW + 1 starts, SW rows), positions, leaf scratch
    idx_t* sw_crd      # sweeps: a fixed fiber's coordinates listed per (row, position)
    double* sw_q       # sweeps: vector stack over positions, one row of SW per slot
    double* sw_r       # sweeps: vector stack over rows
    double* sw_t       # sweeps: per-row values of the row temporaries, SW per slot
    int64_t work       # work counter (loop iterations + reset elements)
    int err
    char line_gap[64]  # (unused: neighbouring threads' contexts never share a cache line)


# ---------------------------------------------------------------- levels --

cdef inline void seek_setup(Plan* P, Ctx* C, int64_t L) noexcept nogil:
    """Open level L's segment under its parent's current position."""
    cdef int64_t par = P.lev_parent[L]
    cdef int64_t p = 0 if par < 0 else C.curpos[par]
    if p < 0:
        C.base[L] = -1
        C.cur[L] = 0
        C.cend[L] = 0
        return
    if P.lev_kind[L] == L_DENSE:
        C.base[L] = p * P.lev_size[L]
        C.cur[L] = C.base[L]
        C.cend[L] = C.base[L] + P.lev_size[L]
    else:
        C.base[L] = 0
        C.cur[L] = P.lev_pos[L][p]
        C.cend[L] = P.lev_pos[L][p + 1]


cdef inline int64_t coord(Plan* P, Ctx* C, int64_t L, int64_t q) noexcept nogil:
    if P.lev_kind[L] == L_DENSE:
        return q - C.base[L]
    return P.lev_crd[L][q]


cdef inline int64_t locate(Plan* P, Ctx* C, int64_t L, int64_t i) noexcept nogil:
    """Position of coordinate i in level L's open segment, or -1.

    Compressed levels gallop forward from a cursor: callers ask for
    increasing i within one opened segment."""
    cdef int64_t b, c, e, lo, hi, step, mid
    cdef const idx_t* crd
    if P.lev_kind[L] == L_DENSE:
        b = C.base[L]
        return b + i if b >= 0 else -1
    c = C.cur[L]
    e = C.cend[L]
    if c >= e:
        return -1
    crd = P.lev_crd[L]
    if crd[c] >= i:
        return c if crd[c] == i else -1
    lo = c
    step = 1
    while lo + step < e and crd[lo + step] < i:
        lo += step
        step <<= 1
    hi = lo + step
    if hi > e:
        hi = e
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if crd[mid] < i:
            lo = mid
        else:
            hi = mid
    C.cur[L] = hi
    if hi < e and crd[hi] == i:
        return hi
    return -1


# ------------------------------------------------------------ statements --

cdef inline int64_t bref_offset(Plan* P, Ctx* C, int64_t r) noexcept nogil:
    cdef int64_t k, off = 0
    cdef int64_t s = P.bref_tstart[r]
    for k in range(s, s + P.bref_nterm[r]):
        off += P.term_stride[k] * C.ival[P.term_var[k]]
    return off


cdef inline double _binary(int64_t op, double x, double y) noexcept nogil:
    """One binary op code on scalars (division: ``0 / y = 0``; max/min keep a NaN)."""
    if op == OP_ADD:
        return x + y
    if op == OP_SUB:
        return x - y
    if op == OP_MUL:
        return x * y
    if op == OP_DIV:
        return 0.0 if x == 0.0 else x / y
    if op == OP_MAX:
        return x if x >= y or x != x else y
    if op == OP_MIN:
        return x if x <= y or x != x else y
    if op == OP_LT:
        return 1.0 if x < y else 0.0
    if op == OP_LE:
        return 1.0 if x <= y else 0.0
    if op == OP_GT:
        return 1.0 if x > y else 0.0
    if op == OP_GE:
        return 1.0 if x >= y else 0.0
    if op == OP_EQ:
        return 1.0 if x == y else 0.0
    return 1.0 if x != y else 0.0


cdef inline double _unary(int64_t op, double x) noexcept nogil:
    """One unary op code on a scalar."""
    if op == OP_NEG:
        return -x
    if op == OP_ABS:
        return fabs(x)
    if op == OP_SQRT:
        return sqrt(x)
    if op == OP_EXP:
        return spfuse_exp(x)   # (the templates' exp: every path gives the same bits)
    if op == OP_LOG:
        return log(x)
    if op == OP_TANH:
        return tanh(x)
    if op == OP_SIGMOID:
        return spfuse_sigmoid(x)
    return x if x > 0.0 else 0.0     # OP_RELU


cdef double eval_code(Plan* P, Ctx* C, int64_t pc, int64_t end) noexcept nogil:
    cdef double st[STACK_SIZE]
    cdef int sp = 0
    cdef int64_t op, q, r
    cdef double x, y
    cdef int64_t* code = P.code
    while pc < end:
        op = code[pc]
        if op == OP_LOAD_ACC:
            r = code[pc + 1]
            q = C.curpos[P.acc_last[r]]
            st[sp] = P.acc_vals[r][q] if q >= 0 else 0.0
            sp += 1
            pc += 2
            continue
        elif op == OP_LOAD_BUF:
            r = code[pc + 1]
            st[sp] = C.buf[P.bref_buf[r]][bref_offset(P, C, r)]
            sp += 1
            pc += 2
            continue
        elif op == OP_CONST:
            st[sp] = P.consts[code[pc + 1]]
            sp += 1
            pc += 2
            continue
        elif op == OP_WHERE:
            sp -= 2
            st[sp - 1] = st[sp] if st[sp - 1] != 0.0 else st[sp + 1]
            pc += 1
            continue
        elif op < OP_WHERE:
            sp -= 1
            st[sp - 1] = _binary(op, st[sp - 1], st[sp])
            pc += 1
            continue
        else:
            st[sp - 1] = _unary(op, st[sp - 1])
            pc += 1
    return st[0]


cdef inline void apply_op(double* dst, int64_t op, double v) noexcept nogil:
    if op == A_SUM:
        dst[0] += v
    elif op == A_ASSIGN:
        dst[0] = v
    elif op == A_MAX:
        if v > dst[0] or v != v:
            dst[0] = v
    else:
        if v < dst[0] or v != v:
            dst[0] = v


cdef int coo_grow(Ctx* C, int64_t c, int64_t nvar) noexcept nogil:
    cdef int64_t cap = C.coo_cap[c] * 2
    if cap < 64:
        cap = 64
    cdef int64_t* ncrd = <int64_t*>realloc(C.coo_crd[c], cap * (nvar if nvar > 0 else 1) * sizeof(int64_t))
    if ncrd == NULL:
        return -1
    C.coo_crd[c] = ncrd
    cdef double* nval = <double*>realloc(C.coo_val[c], cap * sizeof(double))
    if nval == NULL:
        return -1
    C.coo_val[c] = nval
    C.coo_cap[c] = cap
    return 0


cdef inline void ws_apply(Plan* P, Ctx* C, int64_t b, int64_t k, int64_t op, double v) noexcept nogil:
    """Workspace update at coordinate k: the first write since the last flush
    sets (so no clearing pass is needed) and marks k in the bitmap, later
    ones combine by ``op``."""
    cdef int64_t w = P.buf_ws[b]
    cdef int64_t w0 = k >> 6
    cdef uint64_t bit = (<uint64_t>1) << (k & 63)
    cdef uint64_t* bits = C.ws_bits[w]
    if bits[w0] & bit:
        apply_op(C.buf[b] + k, op, v)
        return
    bits[w0] |= bit
    C.buf[b][k] = v
    C.ws_words[w][w0 >> 6] |= (<uint64_t>1) << (w0 & 63)
    if C.ws_lo[w] < 0 or (w0 >> 6) < C.ws_lo[w]:
        C.ws_lo[w] = w0 >> 6
    if (w0 >> 6) > C.ws_hi[w]:
        C.ws_hi[w] = w0 >> 6


cdef int wso_reserve(WsOut* o, int64_t n, int64_t nrec, int64_t width) noexcept nogil:
    """Room for ``n`` more entries and ``nrec`` more records (geometric growth)."""
    cdef int64_t cap
    cdef int64_t* nk
    cdef double* nv
    cdef int64_t* nr
    if o.n + n > o.cap:
        cap = o.cap * 2 if o.cap * 2 > o.n + n else o.n + n + 1024
        nk = <int64_t*>realloc(o.k, cap * sizeof(int64_t))
        if nk == NULL:
            return -1
        o.k = nk
        nv = <double*>realloc(o.v, cap * sizeof(double))
        if nv == NULL:
            return -1
        o.v = nv
        o.cap = cap
    if o.rn + nrec > o.rcap:
        cap = o.rcap * 2 if o.rcap * 2 > o.rn + nrec else o.rn + nrec + 256
        nr = <int64_t*>realloc(o.rec, cap * width * sizeof(int64_t))
        if nr == NULL:
            return -1
        o.rec = nr
        o.rcap = cap
    return 0


cdef void exec_flush(Plan* P, Ctx* C, int64_t w) noexcept nogil:
    """Append a workspace's touched coordinates, in increasing order (read
    back from its bitmap: no sort), and their values to its output's rows,
    with one record (the output's other variables, then the count), and
    clear the bitmap."""
    cdef int64_t lo = C.ws_lo[w]
    cdef int64_t c = P.ws_coo[w]
    cdef int64_t nv = P.coo_nvar[c]
    cdef int64_t vs = P.coo_vstart[c]
    cdef int64_t at = P.ws_pos[w]
    cdef int64_t d, m, n, most
    cdef int64_t* dst
    cdef WsOut* o = &C.wso[w]
    if lo < 0:
        return
    # at most 4096 coordinates per summary word in use
    most = (C.ws_hi[w] - lo + 1) << 12
    if most > P.ws_extent[w]:
        most = P.ws_extent[w]
    if wso_reserve(o, most, 1, nv) != 0:
        C.err = 1
        return
    n = _bitmap_readback(C.buf[P.ws_buf[w]], C.ws_bits[w], C.ws_words[w], lo, C.ws_hi[w],
                         o.k + o.n, o.v + o.n)
    C.ws_lo[w] = -1
    C.ws_hi[w] = -1
    C.work += n
    o.n += n
    dst = o.rec + o.rn * nv
    m = 0
    for d in range(nv):
        if d != at:
            dst[m] = C.ival[P.coo_vars[vs + d]]
            m += 1
    dst[nv - 1] = n
    o.rn += 1


cdef void exec_stmt(Plan* P, Ctx* C, int64_t s) noexcept nogil:
    cdef double v = eval_code(P, C, P.stmt_cstart[s], P.stmt_cstart[s] + P.stmt_clen[s])
    cdef int64_t tk = P.stmt_tkind[s]
    cdef int64_t t = P.stmt_target[s]
    cdef int64_t q, n, nv, k, vs
    cdef int64_t* dst
    if tk == T_BUF:
        apply_op(C.buf[P.bref_buf[t]] + bref_offset(P, C, t), P.stmt_op[s], v)
    elif tk == T_WS:
        ws_apply(P, C, P.bref_buf[t], bref_offset(P, C, t), P.stmt_op[s], v)
    elif tk == T_PATTERN:
        q = C.curpos[P.pat_level[t]]
        if q >= 0:
            apply_op(C.buf[P.pat_buf[t]] + q, P.stmt_op[s], v)
    else:
        n = C.coo_n[t]
        nv = P.coo_nvar[t]
        if n >= C.coo_cap[t]:
            if coo_grow(C, t, nv) != 0:
                C.err = 1
                return
        dst = C.coo_crd[t] + n * nv
        vs = P.coo_vstart[t]
        for k in range(nv):
            dst[k] = C.ival[P.coo_vars[vs + k]]
        C.coo_val[t][n] = v
        C.coo_n[t] = n + 1


cdef void exec_reset(Plan* P, Ctx* C, int64_t r) noexcept nogil:
    cdef double* b = C.buf[P.reset_buf[r]]
    cdef double v = P.reset_value[r]
    cdef int64_t k, n, off, ts, nb, nf, d
    if P.reset_whole[r]:
        n = P.buf_size[P.reset_buf[r]]
        C.work += n
        for k in range(n):
            b[k] = v
        return
    ts = P.reset_tstart[r]
    nb = P.reset_nbound[r]
    nf = P.reset_nfree[r]
    off = 0
    for k in range(ts, ts + nb):
        off += P.rterm_b[k] * C.ival[P.rterm_a[k]]
    ts += nb   # free dims: rterm_a = extent, rterm_b = stride (outermost first)
    n = 1
    for k in range(nf):
        if P.rterm_a[ts + k] == 0:
            return
        n *= P.rterm_a[ts + k]
        C.odo[k] = 0
    C.work += n
    while True:
        n = off
        for k in range(nf):
            n += C.odo[k] * P.rterm_b[ts + k]
        b[n] = v
        d = nf - 1
        while d >= 0:
            C.odo[d] += 1
            if C.odo[d] < P.rterm_a[ts + d]:
                break
            C.odo[d] = 0
            d -= 1
        if d < 0:
            return



# ------------------------------------------------------------ block mode --
# An innermost loop whose body is only statements, none of which reads a
# buffer written in the body and no two of which write the same buffer, is
# run in blocks: the co-iteration collects up to BLK iterations (coordinate
# and positions), then every statement's byte code runs once per block over
# vectors.  Each target still receives its updates in iteration order, so the
# results are bitwise those of the per-element interpretation.

cdef inline int64_t find_level(int64_t* levs, int64_t nl, int64_t L) noexcept nogil:
    cdef int64_t k
    for k in range(nl):
        if levs[k] == L:
            return k
    return -1


cdef inline void bref_split(Plan* P, Ctx* C, int64_t r, int64_t v,
                            int64_t* base, int64_t* sv) noexcept nogil:
    """offset(e) = base + sv * blk_i[e] for a reference inside loop v."""
    cdef int64_t k, s = P.bref_tstart[r]
    base[0] = 0
    sv[0] = 0
    for k in range(s, s + P.bref_nterm[r]):
        if P.term_var[k] == v:
            sv[0] += P.term_stride[k]
        else:
            base[0] += P.term_stride[k] * C.ival[P.term_var[k]]


ctypedef struct VDesc:
    # one operand of a fiber block: element e is p[e * inc] (inc 0 = broadcast)
    const double* p
    int64_t inc


cdef inline void _vbin(int64_t op, VDesc a, VDesc b, double* d, int64_t n) noexcept nogil:
    """d[e] = a[e] op b[e] over a block (d may alias a's row)."""
    cdef int64_t e
    cdef const double* x = a.p
    cdef const double* y = b.p
    cdef int64_t ai = a.inc, bi = b.inc
    cdef double u, w
    if ai == 1 and bi == 1 and op <= OP_MUL:
        if op == OP_ADD:
            for e in range(n):
                d[e] = x[e] + y[e]
        elif op == OP_SUB:
            for e in range(n):
                d[e] = x[e] - y[e]
        else:
            for e in range(n):
                d[e] = x[e] * y[e]
    elif ai + bi == 1 and (op == OP_ADD or op == OP_MUL):
        # one broadcast operand (both ops commute bitwise)
        if ai == 0:
            u = x[0]
            x = y
        else:
            u = y[0]
        if op == OP_ADD:
            for e in range(n):
                d[e] = x[e] + u
        else:
            for e in range(n):
                d[e] = x[e] * u
    elif op == OP_ADD:
        for e in range(n):
            d[e] = x[e * ai] + y[e * bi]
    elif op == OP_SUB:
        for e in range(n):
            d[e] = x[e * ai] - y[e * bi]
    elif op == OP_MUL:
        for e in range(n):
            d[e] = x[e * ai] * y[e * bi]
    elif op == OP_DIV:
        for e in range(n):
            u = x[e * ai]
            d[e] = 0.0 if u == 0.0 else u / y[e * bi]
    else:
        for e in range(n):
            d[e] = _binary(op, x[e * ai], y[e * bi])


cdef inline int _vop(int64_t op, VDesc* st, int sp, double* rows, int64_t width, double* sc,
                     int64_t n) noexcept nogil:
    """Apply a where / binary / unary op code to the top of a vector stack
    (slot ``k``'s vector lives in ``rows + k * width``, a broadcast result in
    ``sc[k]``, apart from the rows it may be combined into); the new depth."""
    cdef int64_t k, e
    cdef double* row
    cdef VDesc c
    if op == OP_WHERE:
        sp -= 2
        c = st[sp - 1]
        k = n if (c.inc or st[sp].inc or st[sp + 1].inc) else 1
        row = rows + (sp - 1) * width if k > 1 else &sc[sp - 1]
        for e in range(k):
            row[e] = st[sp].p[e * st[sp].inc] if c.p[e * c.inc] != 0.0 else st[sp + 1].p[e * st[sp + 1].inc]
    elif op < OP_WHERE:
        sp -= 1
        k = n if (st[sp - 1].inc or st[sp].inc) else 1
        row = rows + (sp - 1) * width if k > 1 else &sc[sp - 1]
        _vbin(op, st[sp - 1], st[sp], row, k)
    else:
        k = n if st[sp - 1].inc else 1
        row = rows + (sp - 1) * width if k > 1 else &sc[sp - 1]
        _vun(op, st[sp - 1], row, k)
    st[sp - 1].p = row
    st[sp - 1].inc = 1 if k > 1 else 0
    return sp


cdef inline void _axpy_rows(double* d, VDesc a, VDesc b, int64_t n) noexcept nogil:
    """d[e] += a[e] * b[e] with the strides resolved, so the compiler
    vectorises the common shapes (a scalar times a dense row: SpMM's axpy)."""
    cdef int64_t e
    cdef const double* x = a.p
    cdef const double* y = b.p
    cdef double u
    if a.inc == 0 and b.inc == 1:
        u = x[0]
        for e in range(n):
            d[e] += u * y[e]
    elif a.inc == 1 and b.inc == 0:
        u = y[0]
        for e in range(n):
            d[e] += x[e] * u
    elif a.inc == 1 and b.inc == 1:
        for e in range(n):
            d[e] += x[e] * y[e]
    else:
        u = x[0] * y[0]
        for e in range(n):
            d[e] += u


cdef inline void _vun(int64_t op, VDesc a, double* d, int64_t n) noexcept nogil:
    cdef int64_t e
    cdef const double* x = a.p
    cdef int64_t ai = a.inc
    cdef double u
    if op == OP_NEG:
        for e in range(n):
            d[e] = -x[e * ai]
    elif op == OP_RELU:
        for e in range(n):
            u = x[e * ai]
            d[e] = u if u > 0.0 else 0.0
    else:
        for e in range(n):
            d[e] = _unary(op, x[e * ai])


cdef void flush_block(Plan* P, Ctx* C, int64_t node, int64_t n) noexcept nogil:
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t v = P.loop_var[lid]
    cdef int64_t nl = P.loop_nlev[lid]
    cdef int64_t* levs = P.loop_levs + P.loop_lev_start[lid]
    cdef int64_t* bi = C.blk_i
    cdef int64_t c = node + 1
    cdef int64_t end = P.node_end[node]
    cdef int64_t s, pc, pend, op, r, L, k, e, q, base, sv, tk, aop, nv, vs, cn
    cdef int sp
    cdef double x
    cdef double* d
    cdef double* a
    cdef double* b
    cdef double* vals
    cdef double* buf
    cdef int64_t* pos
    cdef int64_t* code = P.code
    cdef int64_t* dst
    cdef VDesc va, vb
    va.inc = 1
    vb.inc = 1
    while c < end:
        s = P.node_arg[c]
        c = P.node_end[c]
        pc = P.stmt_cstart[s]
        pend = pc + P.stmt_clen[s]
        sp = 0
        while pc < pend:
            op = code[pc]
            if op <= OP_CONST:
                d = C.vst + sp * BLK
                r = code[pc + 1]
                if op == OP_LOAD_ACC:
                    L = P.acc_last[r]
                    vals = P.acc_vals[r]
                    k = find_level(levs, nl, L)
                    if k >= 0:
                        pos = C.blk_pos + k * BLK
                        for e in range(n):
                            q = pos[e]
                            d[e] = vals[q] if q >= 0 else 0.0
                    else:
                        q = C.curpos[L]
                        x = vals[q] if q >= 0 else 0.0
                        for e in range(n):
                            d[e] = x
                elif op == OP_LOAD_BUF:
                    bref_split(P, C, r, v, &base, &sv)
                    buf = C.buf[P.bref_buf[r]] + base
                    if sv == 0:
                        x = buf[0]
                        for e in range(n):
                            d[e] = x
                    else:
                        for e in range(n):
                            d[e] = buf[sv * bi[e]]
                else:
                    x = P.consts[r]
                    for e in range(n):
                        d[e] = x
                sp += 1
                pc += 2
                continue
            pc += 1
            if op == OP_WHERE:
                sp -= 2
                d = C.vst + (sp - 1) * BLK
                a = d + BLK
                b = a + BLK
                for e in range(n):
                    d[e] = a[e] if d[e] != 0.0 else b[e]
            elif op < OP_WHERE:
                sp -= 1
                d = C.vst + (sp - 1) * BLK
                va.p = d
                vb.p = d + BLK
                _vbin(op, va, vb, d, n)
            else:
                d = C.vst + (sp - 1) * BLK
                va.p = d
                _vun(op, va, d, n)
        # ---- apply to the target, in iteration order
        d = C.vst
        tk = P.stmt_tkind[s]
        r = P.stmt_target[s]
        aop = P.stmt_op[s]
        if tk == T_BUF:
            bref_split(P, C, r, v, &base, &sv)
            buf = C.buf[P.bref_buf[r]] + base
            if aop == A_SUM:
                if sv == 0:
                    x = buf[0]
                    for e in range(n):
                        x += d[e]
                    buf[0] = x
                else:
                    for e in range(n):
                        buf[sv * bi[e]] += d[e]
            elif aop == A_ASSIGN:
                for e in range(n):
                    buf[sv * bi[e]] = d[e]
            else:
                for e in range(n):
                    apply_op(buf + sv * bi[e], aop, d[e])
        elif tk == T_WS:
            bref_split(P, C, r, v, &base, &sv)
            for e in range(n):
                ws_apply(P, C, P.bref_buf[r], base + sv * bi[e], aop, d[e])
        elif tk == T_PATTERN:
            L = P.pat_level[r]
            buf = C.buf[P.pat_buf[r]]
            k = find_level(levs, nl, L)
            if k >= 0:
                pos = C.blk_pos + k * BLK
                for e in range(n):
                    if pos[e] >= 0:
                        apply_op(buf + pos[e], aop, d[e])
            elif C.curpos[L] >= 0:
                for e in range(n):
                    apply_op(buf + C.curpos[L], aop, d[e])
        else:
            nv = P.coo_nvar[r]
            vs = P.coo_vstart[r]
            while C.coo_n[r] + n > C.coo_cap[r]:
                if coo_grow(C, r, nv) != 0:
                    C.err = 1
                    return
            cn = C.coo_n[r]
            for e in range(n):
                dst = C.coo_crd[r] + (cn + e) * nv
                for k in range(nv):
                    L = P.coo_vars[vs + k]
                    dst[k] = bi[e] if L == v else C.ival[L]
                C.coo_val[r][cn + e] = d[e]
            C.coo_n[r] = cn + n


cdef inline int64_t block_push(Plan* P, Ctx* C, int64_t node, int64_t* levs, int64_t nl,
                               int64_t i, int64_t n) noexcept nogil:
    """Record iteration i (positions are in C.curpos); flush when full."""
    cdef int64_t k
    C.blk_i[n] = i
    for k in range(nl):
        C.blk_pos[k * BLK + n] = C.curpos[levs[k]]
    n += 1
    if n == BLK:
        flush_block(P, C, node, n)
        n = 0
    return n


# ----------------------------------------------------------------- loops --

cdef void exec_children(Plan* P, Ctx* C, int64_t node) noexcept nogil:
    cdef int64_t c = node + 1
    cdef int64_t e = P.node_end[node]
    cdef int64_t k
    while c < e:
        k = P.node_kind[c]
        if k == N_STMT:
            exec_stmt(P, C, P.node_arg[c])
        elif k == N_LOOP:
            exec_loop(P, C, c)
        elif k == N_FLUSH:
            exec_flush(P, C, P.node_arg[c])
        else:
            exec_reset(P, C, P.node_arg[c])
        if C.err:
            return
        c = P.node_end[c]


cdef bint loop_range(Plan* P, Ctx* C, int64_t node, int64_t* lo, int64_t* hi) noexcept nogil:
    """Iteration range of a DENSE/INTERSECT loop (coordinates, resp. the
    positions of the first driver).  False when the driver is absent."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t L, par, p
    if P.loop_mode[lid] == M_DENSE:
        lo[0] = 0
        hi[0] = P.var_extent[P.loop_var[lid]]
        return True
    L = P.loop_levs[P.loop_lev_start[lid]]
    par = P.lev_parent[L]
    p = 0 if par < 0 else C.curpos[par]
    if p < 0:
        return False
    if P.lev_kind[L] == L_DENSE:
        lo[0] = p * P.lev_size[L]
        hi[0] = lo[0] + P.lev_size[L]
    else:
        lo[0] = P.lev_pos[L][p]
        hi[0] = P.lev_pos[L][p + 1]
    return True


cdef inline VDesc _vload_level(Plan* P, Ctx* C, int64_t* levs, int64_t nl, bint first, int64_t r,
                               int64_t q, int64_t off, const idx_t* idx, int64_t n,
                               double* row, double* scalar) noexcept nogil:
    """The values of access ``r`` over the block: a view where they are
    contiguous, else gathered into ``row``; one value goes to ``scalar``."""
    cdef VDesc d
    cdef int64_t L = P.acc_last[r]
    cdef int64_t k = find_level(levs, nl, L)
    cdef const double* vals = P.acc_vals[r]
    cdef int64_t b, e, c
    d.inc = 0
    if k < 0:  # bound outside this loop: one value for the block
        c = C.curpos[L]
        scalar[0] = vals[c] if c >= 0 else 0.0
        d.p = scalar
        return d
    if k == 0 and first:  # the compressed driver: positions q, q+1, ...
        d.p = vals + q
        d.inc = 1
        return d
    b = C.base[L]
    if b < 0:
        scalar[0] = 0.0
        d.p = scalar
        return d
    d.inc = 1
    if idx == NULL:
        d.p = vals + b + off
        return d
    for e in range(n):
        row[e] = vals[b + idx[e]]
    d.p = row
    return d


cdef inline bint _ends_with_op(const int64_t* code, int64_t pc, int64_t end, int64_t op) noexcept nogil:
    """Is the byte code's last instruction ``op``?  (Loads take two words:
    their operand may equal an op code.)"""
    cdef int64_t last = -1
    while pc < end:
        if code[pc] <= OP_CONST:
            pc += 2
        else:
            last = pc
            pc += 1
    return last == end - 1 and code[last] == op


cdef void flush_fiber(Plan* P, Ctx* C, int64_t node, int64_t q, int64_t n,
                      const idx_t* idx, int64_t off) noexcept nogil:
    """Block mode over a whole fiber: iteration e has coordinate
    ``idx[e]`` (``off + e`` when ``idx`` is NULL) and, for a compressed
    driver, driver position ``q + e``; every other level of the loop is
    dense.  Operands are used in place where contiguous (no copy), scalars
    are broadcast without being materialised, and ``x += a*b`` runs fused
    (the dot / axpy / scatter-axpy leaves).  Each target is updated in
    iteration order: bitwise the per-element interpretation."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t v = P.loop_var[lid]
    cdef int64_t nl = P.loop_nlev[lid]
    cdef int64_t* levs = P.loop_levs + P.loop_lev_start[lid]
    cdef bint first = P.loop_mode[lid] != M_DENSE
    cdef int64_t c = node + 1
    cdef int64_t end = P.node_end[node]
    cdef int64_t s, pc, pend, op, r, L, k, e, base, sv, aop, b, last
    cdef int sp
    cdef double x
    cdef double* buf
    cdef double* row
    cdef int64_t* code = P.code
    cdef VDesc st[STACK_SIZE]
    cdef double sc[STACK_SIZE]   # broadcast scalars live apart from the rows they are combined into
    cdef VDesc fa, fb
    cdef bint fused
    while c < end:
        s = P.node_arg[c]
        c = P.node_end[c]
        pc = P.stmt_cstart[s]
        pend = pc + P.stmt_clen[s]
        aop = P.stmt_op[s]
        # x += a * b with a buffer target: leave the product to the update
        fused = (aop == A_SUM and (P.stmt_tkind[s] == T_BUF or P.stmt_tkind[s] == T_WS)
                 and _ends_with_op(code, pc, pend, OP_MUL))
        last = pend - 1 if fused else pend
        sp = 0
        while pc < last:
            op = code[pc]
            row = C.vst + sp * BLK
            if op <= OP_CONST:
                r = code[pc + 1]
                if op == OP_LOAD_ACC:
                    st[sp] = _vload_level(P, C, levs, nl, first, r, q, off, idx, n, row, &sc[sp])
                elif op == OP_LOAD_BUF:
                    bref_split(P, C, r, v, &base, &sv)
                    buf = C.buf[P.bref_buf[r]] + base
                    if sv == 0:
                        st[sp].p = buf
                        st[sp].inc = 0
                    elif idx == NULL and sv == 1:
                        st[sp].p = buf + off
                        st[sp].inc = 1
                    else:
                        if idx == NULL:
                            for e in range(n):
                                row[e] = buf[sv * (off + e)]
                        else:
                            for e in range(n):
                                row[e] = buf[sv * idx[e]]
                        st[sp].p = row
                        st[sp].inc = 1
                else:
                    st[sp].p = P.consts + r
                    st[sp].inc = 0
                sp += 1
                pc += 2
                continue
            pc += 1
            sp = _vop(op, st, sp, C.vst, BLK, sc, n)
        if fused:
            fa = st[0]
            fb = st[1]
        else:
            fa = st[0]
            fb.p = &ONE
            fb.inc = 0
        # ---- apply to the target, in iteration order
        r = P.stmt_target[s]
        if P.stmt_tkind[s] == T_BUF:
            bref_split(P, C, r, v, &base, &sv)
            buf = C.buf[P.bref_buf[r]] + base
            if aop == A_SUM:
                if sv == 0:
                    x = buf[0]
                    for e in range(n):
                        x += fa.p[e * fa.inc] * fb.p[e * fb.inc]
                    buf[0] = x
                elif idx == NULL and sv == 1:
                    _axpy_rows(buf + off, fa, fb, n)
                elif idx == NULL:
                    buf += sv * off
                    for e in range(n):
                        buf[sv * e] += fa.p[e * fa.inc] * fb.p[e * fb.inc]
                else:
                    for e in range(n):
                        buf[sv * idx[e]] += fa.p[e * fa.inc] * fb.p[e * fb.inc]
            elif idx == NULL:
                buf += sv * off
                for e in range(n):
                    apply_op(buf + sv * e, aop, fa.p[e * fa.inc])
            else:
                for e in range(n):
                    apply_op(buf + sv * idx[e], aop, fa.p[e * fa.inc])
        elif P.stmt_tkind[s] == T_WS:   # (fb is 1.0 unless fused: x * 1.0 is x exactly)
            bref_split(P, C, r, v, &base, &sv)
            b = P.bref_buf[r]
            for e in range(n):
                ws_apply(P, C, b, base + sv * (off + e if idx == NULL else idx[e]), aop,
                         fa.p[e * fa.inc] * fb.p[e * fb.inc])
        else:  # T_PATTERN (COO outputs never take this path)
            L = P.pat_level[r]
            buf = C.buf[P.pat_buf[r]]
            k = find_level(levs, nl, L)
            if k < 0:
                if C.curpos[L] >= 0:
                    for e in range(n):
                        apply_op(buf + C.curpos[L], aop, fa.p[e * fa.inc])
            elif k == 0 and first:
                buf += q
                for e in range(n):
                    apply_op(buf + e, aop, fa.p[e * fa.inc])
            else:
                b = C.base[L]
                if b >= 0:
                    for e in range(n):
                        apply_op(buf + b + (off + e if idx == NULL else idx[e]), aop, fa.p[e * fa.inc])


cdef double ONE = 1.0


cdef void _fiber_block(Plan* P, Ctx* C, int64_t node, int64_t qlo, int64_t qhi) noexcept nogil:
    """Block loop over a whole fiber at once (``loop_fiber``): a DENSE
    range, or one compressed (or dense) driver, with every other level it
    locates dense -- no coordinate can be absent and locating a dense level
    is ``base + i``, so no per-iteration locate or cursor is needed.  Blocks
    of BLK iterations are cut at the same places as the general path."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t nl = P.loop_nlev[lid]
    cdef int64_t* levs = P.loop_levs + P.loop_lev_start[lid]
    cdef int64_t first = 0 if P.loop_mode[lid] == M_DENSE else 1
    cdef int64_t k, q, n, L, par
    cdef int64_t base0 = 0
    cdef const idx_t* crd0 = NULL
    for k in range(first, nl):
        seek_setup(P, C, levs[k])
    if first:
        L = levs[0]
        if P.lev_kind[L] == L_DENSE:
            par = P.lev_parent[L]
            base0 = (0 if par < 0 else C.curpos[par]) * P.lev_size[L]
        else:
            crd0 = P.lev_crd[L]
    q = qlo
    while q < qhi:
        n = qhi - q
        if n > BLK:
            n = BLK
        flush_fiber(P, C, node, q, n, crd0 + q if crd0 != NULL else NULL, q - base0)
        q += n



# ---------------------------------------------------------------- sweeps --
# A DENSE loop over rows whose body is only resets of row temporaries (0-d
# private buffers), statements, and fiber loops over a compressed level under
# the row (``loop_sweep``, decided once per plan by :func:`_sweep_loops`) runs
# as a *sweep*: rows are taken in batches (up to SW rows, up to SW positions
# of the first fiber), and every child is evaluated once per batch over
# vectors -- over the batch's rows, or over all the positions of its fiber
# loop across the batch's rows (cut into *row segments*: positions
# ``seg[s]:seg[s+1]`` of the chunk belong to batch row ``segrow[s]``).
# Row temporaries become vectors over the batch.  Interpretation is paid per
# batch instead of per row, which is what rows of ~10 entries need.
#
# The rules of :func:`_sweep_loops` keep results bitwise those of the row-by-
# row walk: every buffer the sweep writes is either a row temporary, or
# written at an offset that moves with the row (never shared between rows) by
# references that all agree, or written by one statement and not read in the
# sweep (a scatter or a global accumulator, updated in position order, which
# is the row-by-row order); row reductions add positions in order.

ctypedef struct Sweep:
    int64_t vo          # the row variable
    int64_t* levs_o     # levels located by the row loop
    int64_t nl_o
    int64_t r0          # first row (coordinate) of the batch
    int64_t nr          # rows in the batch
    int64_t vf          # a fiber loop's variable
    int64_t* levs_f
    int64_t nl_f
    int64_t q0          # first driver position of the chunk
    const idx_t* crd    # driver coordinates from q0
    const int64_t* posv # driver positions when the fiber is not contiguous (NULL: q0, q0+1, ...)
    const int64_t* posv2  # a merge fiber's second driver's positions (NULL: no second driver)
    const int64_t* seg  # the chunk's row segments: starts (nseg + 1 entries, the last = n) ...
    const int64_t* segrow  # ... and batch rows (empty rows have no segment)
    int64_t nseg


cdef inline int64_t _sw_terms3(Plan* P, Ctx* C, int64_t r, int64_t vo, int64_t vf, int64_t vk,
                               int64_t* so, int64_t* sf, int64_t* sk) noexcept nogil:
    """Offset of buffer reference ``r`` from the variables other than the
    row, fiber and leaf variables; their strides go to ``so``, ``sf``, ``sk``."""
    cdef int64_t k, base = 0
    so[0] = 0
    sf[0] = 0
    sk[0] = 0
    for k in range(P.bref_tstart[r], P.bref_tstart[r] + P.bref_nterm[r]):
        if P.term_var[k] == vo:
            so[0] += P.term_stride[k]
        elif P.term_var[k] == vf:
            sf[0] += P.term_stride[k]
        elif P.term_var[k] == vk:
            sk[0] += P.term_stride[k]
        else:
            base += P.term_stride[k] * C.ival[P.term_var[k]]
    return base


cdef inline int64_t _sw_terms(Plan* P, Ctx* C, int64_t r, int64_t vo, int64_t vf,
                              int64_t* so, int64_t* sf) noexcept nogil:
    """Offset of buffer reference ``r`` from the variables other than the
    row and fiber variables; their strides go to ``so`` and ``sf``."""
    cdef int64_t sk
    return _sw_terms3(P, C, r, vo, vf, -2, so, sf, &sk)


cdef inline VDesc _sw_scalar(double* sc, double x) noexcept nogil:
    cdef VDesc d
    sc[0] = x
    d.p = sc
    d.inc = 0
    return d


cdef inline void _sw_spread(Sweep* W, const double* v, int64_t stride, double* row) noexcept nogil:
    """``row[e] = v[stride * (batch row of position e)]`` over the chunk."""
    cdef int64_t g, e
    cdef double x
    for g in range(W.nseg):
        x = v[stride * W.segrow[g]]
        for e in range(W.seg[g], W.seg[g + 1]):
            row[e] = x


cdef VDesc _sw_load(Plan* P, Ctx* C, Sweep* W, bint fiber, int64_t op, int64_t r, int64_t n,
                    double* row, double* sc) noexcept nogil:
    """One operand over the chunk's positions (``fiber``) or the batch's rows."""
    cdef VDesc d
    cdef int64_t L, k, par, b, e, so, sf, base, rs, g, sz
    cdef const double* vals
    cdef const double* t
    cdef const idx_t* crd = W.crd
    d.inc = 1
    d.p = row
    if op == OP_CONST:
        d.p = P.consts + r
        d.inc = 0
        return d
    if op == OP_LOAD_BUF:
        rs = P.buf_rslot[P.bref_buf[r]]
        if rs >= 0:
            t = C.sw_t + rs * SW
            if not fiber or P.buf_postemp[P.bref_buf[r]]:
                d.p = t
                return d
            _sw_spread(W, t, 1, row)
            return d
        base = _sw_terms(P, C, r, W.vo, W.vf, &so, &sf)
        vals = C.buf[P.bref_buf[r]] + base
        if so == 0 and sf == 0:
            d.p = vals
            d.inc = 0
        elif not fiber:
            if so == 1:
                d.p = vals + W.r0
            else:
                for e in range(n):
                    row[e] = vals[so * (W.r0 + e)]
        elif sf == 0:
            _sw_spread(W, vals + so * W.r0, so, row)
        else:
            for g in range(W.nseg):
                t = vals + so * (W.r0 + W.segrow[g])
                for e in range(W.seg[g], W.seg[g + 1]):
                    row[e] = t[sf * crd[e]]
        return d
    L = P.acc_last[r]
    vals = P.acc_vals[r]
    k = find_level(W.levs_f, W.nl_f, L) if fiber else -1
    if k == 0:                                   # the fiber's driver
        if W.posv == NULL:
            d.p = vals + W.q0
        else:
            for e in range(n):
                row[e] = vals[W.posv[e]]
        return d
    if k > 0 and W.posv2 != NULL:                # a merge fiber's second driver
        for e in range(n):
            row[e] = vals[W.posv2[e]]
        return d
    if k > 0:                                    # a dense level located by the fiber loop
        par = P.lev_parent[L]
        if par < 0:
            for e in range(n):
                row[e] = vals[crd[e]]
        elif find_level(W.levs_o, W.nl_o, par) >= 0:
            b = C.base[par]
            if b < 0:
                return _sw_scalar(sc, 0.0)
            b += W.r0
            sz = P.lev_size[L]
            for g in range(W.nseg):
                t = vals + (b + W.segrow[g]) * sz
                for e in range(W.seg[g], W.seg[g + 1]):
                    row[e] = t[crd[e]]
        else:
            b = C.curpos[par]
            if b < 0:
                return _sw_scalar(sc, 0.0)
            for e in range(n):
                row[e] = vals[b * P.lev_size[L] + crd[e]]
        return d
    if find_level(W.levs_o, W.nl_o, L) >= 0:     # one value per row
        b = C.base[L]
        if b < 0:
            return _sw_scalar(sc, 0.0)
        if not fiber:
            d.p = vals + b + W.r0
            return d
        _sw_spread(W, vals + b + W.r0, 1, row)
        return d
    b = C.curpos[L]                              # bound outside the sweep
    return _sw_scalar(sc, vals[b] if b >= 0 else 0.0)


cdef VDesc _sw_eval(Plan* P, Ctx* C, Sweep* W, bint fiber, int64_t s, int64_t n,
                    double* sc) noexcept nogil:
    """Statement ``s``'s expression over ``n`` elements (positions or rows)."""
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t pend = pc + P.stmt_clen[s]
    cdef int64_t op, k, e
    cdef int sp = 0
    cdef double* stack = C.sw_q if fiber else C.sw_r
    cdef double* row
    cdef VDesc st[STACK_SIZE]
    cdef VDesc c
    while pc < pend:
        op = P.code[pc]
        if op <= OP_CONST:
            st[sp] = _sw_load(P, C, W, fiber, op, P.code[pc + 1], n, stack + sp * SW, &sc[sp])
            sp += 1
            pc += 2
            continue
        pc += 1
        sp = _vop(op, st, sp, stack, SW, sc, n)
    return st[0]


cdef inline void _sw_segmented(double* dst0, int64_t stride, Sweep* W, int64_t aop,
                               VDesc v) noexcept nogil:
    """Reduce each row segment into ``dst0[stride * row]``: a sum in 4
    chains (:func:`_sum4`, a fixed order), max/min/assign in order (exactly
    ``apply_op`` element by element)."""
    cdef int64_t g, e, e1
    cdef double x, u
    cdef double* dst
    cdef const double* p = v.p
    cdef int64_t inc = v.inc
    for g in range(W.nseg):
        dst = dst0 + stride * W.segrow[g]
        x = dst[0]
        e1 = W.seg[g + 1]
        if aop == A_SUM:
            if inc == 1:
                x += _sum4(p + W.seg[g], e1 - W.seg[g])
            else:
                for e in range(W.seg[g], e1):
                    x += p[0]
        elif aop == A_ASSIGN:
            x = p[(e1 - 1) * inc]
        elif aop == A_MAX:
            for e in range(W.seg[g], e1):
                u = p[e * inc]
                if u > x or u != u:
                    x = u
        else:
            for e in range(W.seg[g], e1):
                u = p[e * inc]
                if u < x or u != u:
                    x = u
        dst[0] = x


cdef inline bint _sw_lazy(Plan* P, Ctx* C, Sweep* W, int64_t pc, const double** p,
                          bint* gathered) noexcept nogil:
    """A fiber load the gather-dot leaf reads in place: the driver's values
    of a contiguous fiber (``p[e]``) or a dense vector over the fiber's
    coordinates (``p[crd[e]]``, ``gathered``)."""
    cdef int64_t r, L, k
    if P.code[pc] != OP_LOAD_ACC:
        return False
    r = P.code[pc + 1]
    L = P.acc_last[r]
    k = find_level(W.levs_f, W.nl_f, L)
    if k == 0 and W.posv == NULL:
        p[0] = P.acc_vals[r] + W.q0
        gathered[0] = False
        return True
    if k > 0 and P.lev_parent[L] < 0:
        p[0] = P.acc_vals[r]
        gathered[0] = True
        return True
    return False


cdef bint _sw_gather_dot(Plan* P, Ctx* C, Sweep* W, int64_t s, int64_t n, double* dst0,
                         int64_t stride) noexcept nogil:
    """``T[row] += a * b`` over the chunk with ``a``, ``b`` read in place
    (the driver's values, a dense vector gathered by the coordinates): the
    SpMV leaf, one pass and no materialised product.  False when the
    statement is not of that shape."""
    cdef int64_t pc = P.stmt_cstart[s]
    cdef const double* a
    cdef const double* b
    cdef bint ga, gb
    cdef const idx_t* ib = W.crd
    cdef int64_t g, e, e1
    cdef double x
    cdef double* dst
    if (P.stmt_clen[s] != 5 or P.code[pc + 4] != OP_MUL or not _sw_lazy(P, C, W, pc, &a, &ga)
            or not _sw_lazy(P, C, W, pc + 2, &b, &gb)):
        return False
    if ga:                               # the gathered operand second
        a, b, ga, gb = b, a, gb, ga
    if ga:
        return False
    for g in range(W.nseg):
        dst = dst0 + stride * W.segrow[g]
        x = dst[0]
        e1 = W.seg[g + 1]
        if gb:                           # 4 chains: a row's adds are not one latency-bound chain
            x += _gather_dot4(a + W.seg[g], b, ib + W.seg[g], e1 - W.seg[g])
        else:
            for e in range(W.seg[g], e1):
                x += a[e] * b[e]
        dst[0] = x
    return True


cdef bint _sw_scatter_axpy(Plan* P, Ctx* C, Sweep* W, int64_t s, double* dst0, int64_t so,
                           int64_t sf) noexcept nogil:
    """``T[row, crd] += a * x`` over the chunk with ``a`` the driver's values
    read in place and ``x`` one value per row (an operand the fiber loop
    does not locate): the scatter leaf of Aᵀx and column sums, no
    materialised product.  False when the statement is not of that shape."""
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t xs, op, r, g, e, so_x, sf_x
    cdef const double* a
    cdef const idx_t* crd = W.crd
    cdef bint ga
    cdef double sc
    cdef double xv
    cdef double* dst
    cdef VDesc X
    if P.stmt_clen[s] != 5 or P.code[pc + 4] != OP_MUL:
        return False
    if _sw_lazy(P, C, W, pc, &a, &ga) and not ga and P.code[pc + 2] <= OP_CONST:
        xs = pc + 2
    elif _sw_lazy(P, C, W, pc + 2, &a, &ga) and not ga:
        xs = pc
    else:
        return False
    op, r = P.code[xs], P.code[xs + 1]
    if op == OP_LOAD_ACC and find_level(W.levs_f, W.nl_f, P.acc_last[r]) >= 0:
        return False                     # located by the fiber loop: not one value per row
    if op == OP_LOAD_BUF:
        if P.buf_rslot[P.bref_buf[r]] >= 0 and P.buf_postemp[P.bref_buf[r]]:
            return False
        _sw_terms(P, C, r, W.vo, W.vf, &so_x, &sf_x)
        if sf_x != 0:
            return False
    X = _sw_load(P, C, W, False, op, r, W.nr, C.sw_r, &sc)
    for g in range(W.nseg):
        xv = X.p[W.segrow[g] * X.inc]
        dst = dst0 + so * W.segrow[g]
        for e in range(W.seg[g], W.seg[g + 1]):
            dst[sf * crd[e]] += a[e] * xv
    return True


cdef void _sw_statement(Plan* P, Ctx* C, Sweep* W, bint fiber, int64_t s, int64_t n) noexcept nogil:
    cdef double sc[STACK_SIZE]
    cdef VDesc v
    cdef int64_t aop = P.stmt_op[s]
    cdef int64_t r = P.stmt_target[s]
    cdef int64_t rs, base, so, sf, e, g, buf_b
    cdef double* buf
    cdef double* dst
    if fiber and aop == A_SUM and P.stmt_tkind[s] == T_BUF:
        rs = P.buf_rslot[P.bref_buf[r]]
        if rs >= 0:
            if not P.buf_postemp[P.bref_buf[r]] and _sw_gather_dot(P, C, W, s, n, C.sw_t + rs * SW, 1):
                return
        else:
            base = _sw_terms(P, C, r, W.vo, W.vf, &so, &sf)
            buf = C.buf[P.bref_buf[r]] + base + so * W.r0
            if sf == 0 and _sw_gather_dot(P, C, W, s, n, buf, so):
                return
            if sf != 0 and _sw_scatter_axpy(P, C, W, s, buf, so, sf):
                return
    v = _sw_eval(P, C, W, fiber, s, n, sc)
    if P.stmt_tkind[s] == T_WS:                 # a row workspace, in position order
        base = _sw_terms(P, C, r, W.vo, W.vf if fiber else -1, &so, &sf)
        buf_b = P.bref_buf[r]
        if not fiber:
            for e in range(n):
                ws_apply(P, C, buf_b, base + so * (W.r0 + e), aop, v.p[e * v.inc])
        else:
            for g in range(W.nseg):
                for e in range(W.seg[g], W.seg[g + 1]):
                    ws_apply(P, C, buf_b, base + so * (W.r0 + W.segrow[g]) + sf * W.crd[e], aop,
                             v.p[e * v.inc])
        return
    if P.stmt_tkind[s] == T_PATTERN:            # the fiber driver's pattern
        buf = C.buf[P.pat_buf[r]]
        if W.posv2 != NULL and P.pat_level[r] != W.levs_f[0]:   # a merge fiber's second driver
            for e in range(n):
                apply_op(buf + W.posv2[e], aop, v.p[e * v.inc])
        elif W.posv == NULL:
            buf += W.q0
            if aop == A_ASSIGN and v.inc == 1:
                for e in range(n):
                    buf[e] = v.p[e]
            else:
                for e in range(n):
                    apply_op(buf + e, aop, v.p[e * v.inc])
        else:
            for e in range(n):
                apply_op(buf + W.posv[e], aop, v.p[e * v.inc])
        return
    rs = P.buf_rslot[P.bref_buf[r]]
    if rs >= 0 and P.buf_postemp[P.bref_buf[r]]:    # a value per position
        buf = C.sw_t + rs * SW
        for e in range(n):
            apply_op(buf + e, aop, v.p[e * v.inc])
        return
    if rs >= 0:
        buf = C.sw_t + rs * SW
        so = 1
        sf = 0
    else:
        base = _sw_terms(P, C, r, W.vo, W.vf if fiber else -1, &so, &sf)
        buf = C.buf[P.bref_buf[r]] + base + so * W.r0
    if not fiber:
        for e in range(n):
            apply_op(buf + so * e, aop, v.p[e * v.inc])
    elif sf == 0:
        _sw_segmented(buf, so, W, aop, v)
    elif aop == A_SUM and v.inc == 1:           # a scatter-add (Aᵀx, column sums)
        for g in range(W.nseg):
            dst = buf + so * W.segrow[g]
            for e in range(W.seg[g], W.seg[g + 1]):
                dst[sf * W.crd[e]] += v.p[e]
    else:
        for g in range(W.nseg):
            dst = buf + so * W.segrow[g]
            for e in range(W.seg[g], W.seg[g + 1]):
                apply_op(dst + sf * W.crd[e], aop, v.p[e * v.inc])


cdef int64_t _sw_level_pos(Plan* P, Ctx* C, Sweep* W, int64_t L, int64_t n, int64_t* out) noexcept nogil:
    """Positions of level ``L`` over the chunk, for a level bound by the
    sweep (its row loop or fiber loop) or outside it, or the root (``L``
    -1: the parent of a tensor's first level, position 0): -1 when absent
    throughout, 0 when one position (``out[0]``) serves every element, 1
    when ``out[e]`` is element e's (-1 where absent)."""
    cdef int64_t k, b, g, e, par, sz
    if L < 0:                               # the root (a driver's level has no parent): position 0
        out[0] = 0
        return 0
    k = find_level(W.levs_f, W.nl_f, L)
    if k == 0:                              # the fiber's driver
        for e in range(n):
            out[e] = W.q0 + e if W.posv == NULL else W.posv[e]
        return 1
    if k > 0 and W.posv2 != NULL:           # a merge fiber's second driver
        for e in range(n):
            out[e] = W.posv2[e]
        return 1
    if k > 0:                               # a dense level located by the fiber loop
        par = P.lev_parent[L]
        sz = P.lev_size[L]
        if par < 0:
            for e in range(n):
                out[e] = W.crd[e]
            return 1
        if find_level(W.levs_o, W.nl_o, par) >= 0:
            b = C.base[par]
            if b < 0:
                return -1
            b += W.r0
            for g in range(W.nseg):
                for e in range(W.seg[g], W.seg[g + 1]):
                    out[e] = (b + W.segrow[g]) * sz + W.crd[e]
            return 1
        b = C.curpos[par]
        if b < 0:
            return -1
        for e in range(n):
            out[e] = b * sz + W.crd[e]
        return 1
    if find_level(W.levs_o, W.nl_o, L) >= 0:    # one position per row
        b = C.base[L]
        if b < 0:
            return -1
        b += W.r0
        for g in range(W.nseg):
            for e in range(W.seg[g], W.seg[g + 1]):
                out[e] = b + W.segrow[g]
        return 1
    out[0] = C.curpos[L]                    # bound outside the sweep
    return -1 if out[0] < 0 else 0


cdef void _sw_dot(Plan* P, Ctx* C, Sweep* W, int64_t node, int64_t n) noexcept nogil:
    """A dense dot leaf (:func:`_dot_leaf`) at every position of the chunk:
    ``t[e] += sum_k a(e)[k] * b(e)[k]``, each factor's row found from its
    level above the loop's.  The dot adds in 8 chains (:func:`_dot`): the
    same for any thread count, not bitwise the sequential element walk."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t s = P.node_arg[node + 1]
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t K = P.var_extent[P.loop_var[lid]]
    cdef double* t = C.sw_t + P.buf_rslot[P.bref_buf[P.stmt_target[s]]] * SW
    cdef int64_t* pa = C.sw_rowid + 4 * SW + 1
    cdef int64_t* pb = pa + SW
    cdef int64_t ra = P.code[pc + 1], rb = P.code[pc + 3]
    cdef const double* va = P.acc_vals[ra]
    cdef const double* vb = P.acc_vals[rb]
    cdef int64_t ma = _sw_level_pos(P, C, W, P.lev_parent[P.acc_last[ra]], n, pa)
    cdef int64_t mb = _sw_level_pos(P, C, W, P.lev_parent[P.acc_last[rb]], n, pb)
    cdef int64_t sa = P.lev_size[P.acc_last[ra]], sb = P.lev_size[P.acc_last[rb]]
    cdef int64_t e, k, qa, qb
    cdef double acc
    C.work += n * K
    for e in range(n):
        if e + PREFETCH_AHEAD < n:      # the rows of a later position: gathers miss the cache
            if ma == 1 and pa[e + PREFETCH_AHEAD] >= 0:
                _prefetch_row(va + pa[e + PREFETCH_AHEAD] * sa, K)
            if mb == 1 and pb[e + PREFETCH_AHEAD] >= 0:
                _prefetch_row(vb + pb[e + PREFETCH_AHEAD] * sb, K)
        qa = pa[e * ma] if ma >= 0 else -1
        qb = pb[e * mb] if mb >= 0 else -1
        if qa >= 0 and qb >= 0:
            t[e] += _dot(va + qa * sa, vb + qb * sb, K)
        else:                               # an absent factor reads 0 (0 * inf is nan, as elementwise)
            acc = t[e]
            for k in range(K):
                acc += (0.0 if qa < 0 else va[qa * sa + k]) * (0.0 if qb < 0 else vb[qb * sb + k])
            t[e] = acc


cdef void _sw_axpy(Plan* P, Ctx* C, Sweep* W, int64_t node, int64_t n) noexcept nogil:
    """A dense axpy leaf (:func:`_axpy_leaf`) at every position of the chunk,
    in position order: ``T[..., k] += x(e) * b(e)[k]`` (the element walk's
    updates, in its order: bitwise the same)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t s = P.node_arg[node + 1]
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t v = P.loop_var[lid]
    cdef int64_t K = P.var_extent[v]
    cdef int64_t* pb = C.sw_rowid + 4 * SW + 1
    cdef int64_t nl = P.loop_nlev[lid]
    cdef int64_t* levs = P.loop_levs + P.loop_lev_start[lid]
    cdef int64_t xs, rb, mb, sb, base, so, sf, sk, g, e, k, qb
    cdef double sc
    cdef double x
    cdef VDesc xv
    cdef const double* vb
    cdef const double* src
    cdef double* dst
    cdef double* rowdst
    # which factor is the row (reads the loop's level) and which the scalar
    if P.code[pc] == OP_LOAD_ACC and find_level(levs, nl, P.acc_last[P.code[pc + 1]]) >= 0:
        rb, xs = P.code[pc + 1], pc + 2
    else:
        rb, xs = P.code[pc + 3], pc
    xv = _sw_load(P, C, W, True, P.code[xs], P.code[xs + 1], n, C.sw_q, &sc)
    vb = P.acc_vals[rb]
    sb = P.lev_size[P.acc_last[rb]]
    mb = _sw_level_pos(P, C, W, P.lev_parent[P.acc_last[rb]], n, pb)
    base = _sw_terms3(P, C, P.stmt_target[s], W.vo, W.vf, v, &so, &sf, &sk)
    rowdst = C.buf[P.bref_buf[P.stmt_target[s]]] + base + so * W.r0
    C.work += n * K
    for g in range(W.nseg):
        for e in range(W.seg[g], W.seg[g + 1]):
            if e + PREFETCH_AHEAD < n and mb == 1 and pb[e + PREFETCH_AHEAD] >= 0:
                _prefetch_row(vb + pb[e + PREFETCH_AHEAD] * sb, K)
            dst = rowdst + so * W.segrow[g] + sf * W.crd[e]
            x = xv.p[e * xv.inc]
            qb = pb[e * mb] if mb >= 0 else -1
            if qb < 0:                      # an absent row reads 0 (x * 0 may be nan, as elementwise)
                for k in range(K):
                    dst[k * sk] += x * 0.0
            elif sk == 1:
                src = vb + qb * sb
                for k in range(K):
                    dst[k] += x * src[k]
            else:
                src = vb + qb * sb
                for k in range(K):
                    dst[k * sk] += x * src[k]


cdef void _sw_gdot(Plan* P, Ctx* C, Sweep* W, int64_t node, int64_t n) noexcept nogil:
    """A sparse gather-dot leaf (:func:`_gdot_leaf`) at every position of the
    chunk: ``T[...] += sum_q a[q] * v[crd[q]]`` over the fiber under
    position e, each product added in turn, positions in order (bitwise the
    element walk; a workspace entry's first write sets it)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t s = P.node_arg[node + 1]
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t r = P.stmt_target[s]
    cdef int64_t b = P.bref_buf[r]
    cdef int64_t Ld = P.loop_levs[P.loop_lev_start[lid]]
    cdef const idx_t* pos = P.lev_pos[Ld]
    cdef const idx_t* crd = P.lev_crd[Ld]
    cdef bint temp = P.buf_rslot[b] >= 0 and P.buf_postemp[b] != 0
    cdef bint ws = P.stmt_tkind[s] == T_WS
    cdef double* t = C.sw_t + P.buf_rslot[b] * SW if temp else NULL
    cdef int64_t ra = P.code[pc + 1], rb = P.code[pc + 3]
    cdef const double* a
    cdef const double* v
    cdef int64_t e, g, q, p, q0, q1, base = 0, so = 0, sf = 0, off
    cdef double x
    cdef double* dst
    if P.acc_last[ra] != Ld:
        ra, rb = rb, ra
    a = P.acc_vals[ra]
    v = P.acc_vals[rb]
    if not temp:
        base = _sw_terms(P, C, r, W.vo, W.vf, &so, &sf) + so * W.r0
    for g in range(W.nseg):
        for e in range(W.seg[g], W.seg[g + 1]):
            p = W.q0 + e if W.posv == NULL else W.posv[e]
            q0 = pos[p]
            q1 = pos[p + 1]
            C.work += q1 - q0
            if temp:
                dst = t + e
            else:
                if q0 == q1:
                    continue                # the walk never touches the target
                off = base + so * W.segrow[g] + sf * W.crd[e]
                if ws:                      # the first product marks (or adds to) the entry
                    ws_apply(P, C, b, off, A_SUM, a[q0] * v[crd[q0]])
                    q0 += 1
                dst = C.buf[b] + off
            x = dst[0]
            for q in range(q0, q1):
                x += a[q] * v[crd[q]]
            dst[0] = x


cdef void _sw_saxpy(Plan* P, Ctx* C, Sweep* W, int64_t node, int64_t n) noexcept nogil:
    """A sparse scatter-axpy leaf (:func:`_saxpy_leaf`) at every position of
    the chunk, in position order: ``T[..., crd[q]] += a[q] * x(e)`` over the
    fiber under position e (TTV on a middle mode: the element walk's
    updates, in its order: bitwise the same)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t s = P.node_arg[node + 1]
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t r = P.stmt_target[s]
    cdef int64_t Ld = P.loop_levs[P.loop_lev_start[lid]]
    cdef const idx_t* pos = P.lev_pos[Ld]
    cdef const idx_t* crd = P.lev_crd[Ld]
    cdef int64_t xs, ra, g, e, p, q, q0, q1, base, so, sf, sk
    cdef double sc
    cdef double x
    cdef VDesc xv
    cdef const double* a
    cdef double* rowdst
    cdef double* dst
    if P.code[pc] == OP_LOAD_ACC and P.acc_last[P.code[pc + 1]] == Ld:
        ra, xs = P.code[pc + 1], pc + 2
    else:
        ra, xs = P.code[pc + 3], pc
    a = P.acc_vals[ra]
    xv = _sw_load(P, C, W, True, P.code[xs], P.code[xs + 1], n, C.sw_q, &sc)
    base = _sw_terms3(P, C, r, W.vo, W.vf, P.loop_var[lid], &so, &sf, &sk)
    rowdst = C.buf[P.bref_buf[r]] + base + so * W.r0
    for g in range(W.nseg):
        for e in range(W.seg[g], W.seg[g + 1]):
            p = W.q0 + e if W.posv == NULL else W.posv[e]
            q0 = pos[p]
            q1 = pos[p + 1]
            C.work += q1 - q0
            x = xv.p[e * xv.inc]
            dst = rowdst + so * W.segrow[g] + sf * W.crd[e]
            for q in range(q0, q1):
                dst[sk * crd[q]] += a[q] * x


cdef void _sw_idot(Plan* P, Ctx* C, Sweep* W, int64_t node, int64_t n) noexcept nogil:
    """A sparse∩sparse dot leaf (:func:`_idot_leaf`) at every position of
    the chunk: the two drivers' fibers under position e merged, ``t[e] +=
    a * b`` at every common coordinate in increasing order (bitwise the
    element walk, which visits the same matches in the same order)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t s = P.node_arg[node + 1]
    cdef int64_t pc = P.stmt_cstart[s]
    cdef int64_t La = P.loop_levs[P.loop_lev_start[lid]]
    cdef int64_t Lb = P.loop_levs[P.loop_lev_start[lid] + 1]
    cdef double* t = C.sw_t + P.buf_rslot[P.bref_buf[P.stmt_target[s]]] * SW
    cdef int64_t* pa = C.sw_rowid + 4 * SW + 1
    cdef int64_t* pb = pa + SW
    cdef int64_t ma = _sw_level_pos(P, C, W, P.lev_parent[La], n, pa)
    cdef int64_t mb = _sw_level_pos(P, C, W, P.lev_parent[Lb], n, pb)
    cdef const idx_t* posa = P.lev_pos[La]
    cdef const idx_t* posb = P.lev_pos[Lb]
    cdef const idx_t* ca = P.lev_crd[La]
    cdef const idx_t* cb = P.lev_crd[Lb]
    cdef const double* va
    cdef const double* vb
    cdef int64_t e, qa, qb, ea, eb, xa, xb, ja, jb, ra = P.code[pc + 1], rb = P.code[pc + 3]
    cdef double x
    if P.acc_last[ra] != La:
        ra, rb = rb, ra
    va = P.acc_vals[ra]
    vb = P.acc_vals[rb]
    if ma < 0 or mb < 0:                    # a driver absent throughout: no match
        return
    for e in range(n):
        xa = pa[e * ma]
        xb = pb[e * mb]
        if xa < 0 or xb < 0:
            continue
        qa = posa[xa]
        ea = posa[xa + 1]
        qb = posb[xb]
        eb = posb[xb + 1]
        C.work += (ea - qa) + (eb - qb)
        x = t[e]
        while qa < ea and qb < eb:         # advance by comparison results: few branches to mispredict
            ja = ca[qa]
            jb = cb[qb]
            if ja == jb:
                x += va[qa] * vb[qb]
            qa += ja <= jb
            qb += jb <= ja
        t[e] = x


cdef inline void _sw_fiber_statements(Plan* P, Ctx* C, Sweep* W, int64_t node, int64_t n) noexcept nogil:
    """The fiber loop's children over the chunk's ``n`` positions."""
    cdef int64_t c = node + 1
    cdef int64_t k, e
    cdef double* t
    cdef double val
    C.work += n
    while c < P.node_end[node]:
        k = P.node_kind[c]
        if k == N_STMT:
            _sw_statement(P, C, W, True, P.node_arg[c], n)
        elif k == N_RESET:                  # a position temporary
            t = C.sw_t + P.buf_rslot[P.reset_buf[P.node_arg[c]]] * SW
            val = P.reset_value[P.node_arg[c]]
            for e in range(n):
                t[e] = val
        elif P.loop_leaf[P.node_arg[c]] == LEAF_DOT:
            _sw_dot(P, C, W, c, n)
        elif P.loop_leaf[P.node_arg[c]] == LEAF_AXPY:
            _sw_axpy(P, C, W, c, n)
        elif P.loop_leaf[P.node_arg[c]] == LEAF_GDOT:
            _sw_gdot(P, C, W, c, n)
        elif P.loop_leaf[P.node_arg[c]] == LEAF_SAXPY:
            _sw_saxpy(P, C, W, c, n)
        else:
            _sw_idot(P, C, W, c, n)
        c = P.node_end[c]


cdef void _sw_merge_fiber(Plan* P, Ctx* C, Sweep* W, int64_t node) noexcept nogil:
    """A fiber loop co-iterating two compressed drivers (an intersection)
    over all the batch's rows: each row's two fibers merged, the matches'
    positions and coordinates listed SW at a time, then the loop's
    statements run over them (element-wise A∘B, the inner product)."""
    cdef int64_t La = W.levs_f[0], Lb = W.levs_f[1]
    cdef int64_t ba = C.base[P.lev_parent[La]], bb = C.base[P.lev_parent[Lb]]
    cdef const idx_t* pa = P.lev_pos[La]
    cdef const idx_t* pb = P.lev_pos[Lb]
    cdef const idx_t* ca = P.lev_crd[La]
    cdef const idx_t* cb = P.lev_crd[Lb]
    cdef int64_t* seg = C.sw_rowid
    cdef int64_t* segrow = C.sw_rowid + SW + 1
    cdef int64_t* posv = C.sw_rowid + 2 * SW + 1
    cdef int64_t* posv2 = C.sw_rowid + 3 * SW + 1
    cdef idx_t* crdv = C.sw_crd
    cdef int64_t rr, ia, ea, ib, eb, n0, n = 0, ns = 0
    cdef idx_t x, y
    if ba < 0 or bb < 0:
        return
    ba += W.r0
    bb += W.r0
    W.seg = seg
    W.segrow = segrow
    W.posv = posv
    W.posv2 = posv2
    W.crd = crdv
    W.q0 = 0
    for rr in range(W.nr):
        ia = pa[ba + rr]
        ea = pa[ba + rr + 1]
        ib = pb[bb + rr]
        eb = pb[bb + rr + 1]
        n0 = n
        while ia < ea and ib < eb:
            # branch-free: a match is listed by keeping its slot (n advances)
            x = ca[ia]
            y = cb[ib]
            posv[n] = ia
            posv2[n] = ib
            crdv[n] = x
            n += x == y
            ia += x <= y
            ib += y <= x
            if n == SW:
                seg[ns] = n0
                segrow[ns] = rr
                seg[ns + 1] = n
                W.nseg = ns + 1
                _sw_fiber_statements(P, C, W, node, n)
                n = n0 = ns = 0
        if n > n0:
            seg[ns] = n0
            segrow[ns] = rr
            ns += 1
    if n > 0:
        seg[ns] = n
        W.nseg = ns
        _sw_fiber_statements(P, C, W, node, n)
    W.posv = NULL
    W.posv2 = NULL


cdef void _sw_fiber(Plan* P, Ctx* C, Sweep* W, int64_t node) noexcept nogil:
    """A fiber loop over all the batch's rows, SW positions at a time.

    The fiber is a row's when its driver's parent level is located by the
    row loop (positions of consecutive rows are consecutive); otherwise it
    is one fiber fixed outside the sweep, visited once per row (the
    positions of the (row, position) pairs are listed)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t Ld, par, pb, qa, qb, q, e, f0, L, t, total, n, ns, rr, a, r = 0
    cdef const idx_t* pos
    cdef const idx_t* crd
    cdef int64_t* seg = C.sw_rowid
    cdef int64_t* segrow = C.sw_rowid + SW + 1
    cdef int64_t* posv = C.sw_rowid + 2 * SW + 1
    cdef idx_t* crdv = C.sw_crd
    W.vf = P.loop_var[lid]
    W.nl_f = P.loop_nlev[lid]
    W.levs_f = P.loop_levs + P.loop_lev_start[lid]
    W.seg = seg
    W.segrow = segrow
    W.posv = NULL
    W.posv2 = NULL
    if P.loop_ndrv[lid] == 2:
        _sw_merge_fiber(P, C, W, node)
        return
    Ld = W.levs_f[0]
    par = P.lev_parent[Ld]
    pos = P.lev_pos[Ld]
    crd = P.lev_crd[Ld]
    if par >= 0 and find_level(W.levs_o, W.nl_o, par) >= 0:
        pb = C.base[par]
        if pb < 0:
            return
        pb += W.r0
        qa = pos[pb]
        while qa < pos[pb + W.nr]:
            qb = pos[pb + W.nr]
            if qb - qa > SW:
                qb = qa + SW
            while pos[pb + r + 1] <= qa:   # rows done (or empty) before the chunk
                r += 1
            ns = 0
            rr = r
            while rr < W.nr and pos[pb + rr] < qb:   # rows' runs of positions (empty rows skipped)
                a = pos[pb + rr] if pos[pb + rr] > qa else qa
                if pos[pb + rr + 1] > a:
                    seg[ns] = a - qa
                    segrow[ns] = rr
                    ns += 1
                rr += 1
            seg[ns] = qb - qa
            W.nseg = ns
            W.q0 = qa
            W.crd = crd + qa
            _sw_fiber_statements(P, C, W, node, qb - qa)
            qa = qb
        return
    pb = 0 if par < 0 else C.curpos[par]
    if pb < 0:
        return
    f0 = pos[pb]
    L = pos[pb + 1] - f0
    total = L * W.nr
    t = 0
    q = 0
    while t < total:
        n = total - t if total - t < SW else SW
        ns = 0
        for e in range(n):
            if e == 0 or q == 0:
                seg[ns] = e
                segrow[ns] = r
                ns += 1
            posv[e] = f0 + q
            crdv[e] = crd[f0 + q]
            q += 1
            if q == L:
                q = 0
                r += 1
        seg[ns] = n
        W.nseg = ns
        W.q0 = f0
        W.crd = crdv
        W.posv = posv
        _sw_fiber_statements(P, C, W, node, n)
        t += n
    W.posv = NULL


cdef void _sweep(Plan* P, Ctx* C, int64_t node, int64_t lo, int64_t hi) noexcept nogil:
    """Rows ``[lo, hi)`` of a sweep loop, in batches."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t end = P.node_end[node]
    cdef int64_t k, c, r1, a, b, Ld = -1, pb = -1, rs, e
    cdef const idx_t* pos = NULL
    cdef double* t
    cdef double val
    cdef Sweep W
    W.vo = P.loop_var[lid]
    W.levs_o = P.loop_levs + P.loop_lev_start[lid]
    W.nl_o = P.loop_nlev[lid]
    W.vf = -1
    W.nl_f = 0
    W.levs_f = NULL
    W.posv = NULL
    W.posv2 = NULL
    for k in range(W.nl_o):
        seek_setup(P, C, W.levs_o[k])
    c = node + 1
    while c < end:                     # the first row's fiber sizes the batches
        if P.node_kind[c] == N_LOOP:
            Ld = P.loop_levs[P.loop_lev_start[P.node_arg[c]]]
            if P.lev_parent[Ld] >= 0 and find_level(W.levs_o, W.nl_o, P.lev_parent[Ld]) >= 0:
                pb = C.base[P.lev_parent[Ld]]
                pos = P.lev_pos[Ld]
                break
        c = P.node_end[c]
    W.r0 = lo
    while W.r0 < hi:
        r1 = hi if hi - W.r0 <= SW else W.r0 + SW
        if pos != NULL and pb >= 0:
            # the largest r1 whose positions fit (at least one row): a forward
            # scan, as the batch's rows are read next anyway (probing pos
            # SW rows ahead, or bisecting it, missed the cache every batch)
            a = W.r0 + 1
            b = pos[pb + W.r0] + SW
            while a < r1 and pos[pb + a + 1] <= b:
                a += 1
            r1 = a
        W.nr = r1 - W.r0
        C.ival[W.vo] = W.r0
        c = node + 1
        while c < end:
            k = P.node_kind[c]
            if k == N_RESET:
                rs = P.buf_rslot[P.reset_buf[P.node_arg[c]]]
                t = C.sw_t + rs * SW
                val = P.reset_value[P.node_arg[c]]
                for e in range(W.nr):
                    t[e] = val
            elif k == N_STMT:
                W.vf = -1
                _sw_statement(P, C, &W, False, P.node_arg[c], W.nr)
            else:
                _sw_fiber(P, C, &W, c)
            c = P.node_end[c]
        W.r0 = r1


cdef void _fiber_sweep(Plan* P, Ctx* C, int64_t node, int64_t qlo, int64_t qhi) noexcept nogil:
    """Positions ``[qlo, qhi)`` of a fiber loop swept on its own
    (``SWEEP_FIBER``): its children run over chunks of SW positions as one
    row's fiber (every level outside the loop is bound, as in the walk)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t q = qlo, n
    cdef const idx_t* crd = P.lev_crd[P.loop_levs[P.loop_lev_start[lid]]]
    cdef Sweep W
    W.vo = -1
    W.levs_o = NULL
    W.nl_o = 0
    W.r0 = 0
    W.nr = 1
    W.vf = P.loop_var[lid]
    W.nl_f = P.loop_nlev[lid]
    W.levs_f = P.loop_levs + P.loop_lev_start[lid]
    W.posv = NULL
    W.posv2 = NULL
    W.seg = C.sw_rowid
    W.segrow = C.sw_rowid + SW + 1
    W.nseg = 1
    C.sw_rowid[0] = 0
    C.sw_rowid[SW + 1] = 0
    while q < qhi:
        n = qhi - q if qhi - q < SW else SW
        C.sw_rowid[1] = n
        W.q0 = q
        W.crd = crd + q
        _sw_fiber_statements(P, C, &W, node, n)
        q += n


cdef void exec_loop_range(Plan* P, Ctx* C, int64_t node, int64_t qlo, int64_t qhi) noexcept nogil:
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t v = P.loop_var[lid]
    cdef int64_t nd = P.loop_ndrv[lid]
    cdef int64_t nl = P.loop_nlev[lid]
    cdef int64_t* levs = P.loop_levs + P.loop_lev_start[lid]
    cdef int64_t k, q, i, r, L0, base0 = 0, nb = 0
    cdef const idx_t* crd0 = NULL
    cdef bint ok
    cdef bint blk = P.loop_block[lid] != 0
    if P.loop_fiber[lid]:
        _fiber_block(P, C, node, qlo, qhi)
        return
    if P.loop_sweep[lid] == SWEEP_ROWS:
        _sweep(P, C, node, qlo, qhi)
        return
    if P.loop_sweep[lid] == SWEEP_FIBER:
        _fiber_sweep(P, C, node, qlo, qhi)
        return
    if P.loop_mode[lid] == M_DENSE:
        for k in range(nl):
            seek_setup(P, C, levs[k])
        for i in range(qlo, qhi):
            C.ival[v] = i
            for k in range(nl):
                C.curpos[levs[k]] = locate(P, C, levs[k], i)
            if blk:
                nb = block_push(P, C, node, levs, nl, i, nb)
            else:
                exec_children(P, C, node)
            if C.err:
                return
        if nb:
            flush_block(P, C, node, nb)
        return
    # INTERSECT: iterate the first driver, locate the rest
    L0 = levs[0]
    for k in range(1, nl):
        seek_setup(P, C, levs[k])
    if P.lev_kind[L0] == L_DENSE:
        k = P.lev_parent[L0]
        base0 = (0 if k < 0 else C.curpos[k]) * P.lev_size[L0]
    else:
        crd0 = P.lev_crd[L0]
    for q in range(qlo, qhi):
        i = crd0[q] if crd0 != NULL else q - base0
        ok = True
        for k in range(1, nd):
            r = locate(P, C, levs[k], i)
            if r < 0:
                ok = False
                break
            C.curpos[levs[k]] = r
        if not ok:
            continue
        for k in range(nd, nl):
            C.curpos[levs[k]] = locate(P, C, levs[k], i)
        C.curpos[L0] = q
        C.ival[v] = i
        if blk:
            nb = block_push(P, C, node, levs, nl, i, nb)
        else:
            exec_children(P, C, node)
        if C.err:
            return
    if nb:
        flush_block(P, C, node, nb)


cdef void exec_union(Plan* P, Ctx* C, int64_t node) noexcept nogil:
    exec_union_part(P, C, node, False, INT64_MAX)


cdef bint exec_union_part(Plan* P, Ctx* C, int64_t node, bint resume,
                          int64_t limit) noexcept nogil:
    """K-way merge loop; stops (returns False) after the first iteration at
    which ``C.work >= limit``, True once finished (or on error).  With
    ``resume`` it continues from the merge cursors left by the previous
    call on the same context instead of opening the segments (the top-level
    executor resumes a union loop between signal checks)."""
    cdef int64_t lid = P.node_arg[node]
    cdef int64_t v = P.loop_var[lid]
    cdef int64_t nd = P.loop_ndrv[lid]
    cdef int64_t nl = P.loop_nlev[lid]
    cdef int64_t* levs = P.loop_levs + P.loop_lev_start[lid]
    cdef int64_t k, L, i, c, nb = 0
    cdef bint blk = P.loop_block[lid] != 0
    if not resume:
        for k in range(nl):
            seek_setup(P, C, levs[k])
    while True:
        i = INT64_MAX
        for k in range(nd):
            L = levs[k]
            if C.cur[L] < C.cend[L]:
                c = coord(P, C, L, C.cur[L])
                if c < i:
                    i = c
        if i == INT64_MAX:
            break
        for k in range(nd):
            L = levs[k]
            if C.cur[L] < C.cend[L] and coord(P, C, L, C.cur[L]) == i:
                C.curpos[L] = C.cur[L]
                C.cur[L] += 1
            else:
                C.curpos[L] = -1
        for k in range(nd, nl):
            C.curpos[levs[k]] = locate(P, C, levs[k], i)
        C.ival[v] = i
        C.work += 1
        if blk:
            nb = block_push(P, C, node, levs, nl, i, nb)
        else:
            exec_children(P, C, node)
        if C.err:
            return True
        if C.work >= limit:
            if nb:
                flush_block(P, C, node, nb)
            return False
    if nb:
        flush_block(P, C, node, nb)
    return True


cdef void exec_loop(Plan* P, Ctx* C, int64_t node) noexcept nogil:
    cdef int64_t lo, hi
    if P.loop_mode[P.node_arg[node]] == M_UNION:
        exec_union(P, C, node)
    elif loop_range(P, C, node, &lo, &hi):
        # counted here, not in exec_loop_range: measured ~3% faster
        C.work += hi - lo
        exec_loop_range(P, C, node, lo, hi)


cdef void exec_node(Plan* P, Ctx* C, int64_t node) noexcept nogil:
    cdef int64_t k = P.node_kind[node]
    if k == N_LOOP:
        exec_loop(P, C, node)
    elif k == N_STMT:
        exec_stmt(P, C, P.node_arg[node])
    elif k == N_FLUSH:
        exec_flush(P, C, P.node_arg[node])
    else:
        exec_reset(P, C, P.node_arg[node])


# ------------------------------------------------- top-level chunks -------

cdef inline int64_t _lt_chunk(int64_t nthreads) noexcept nogil:
    """Interpreter work units of one chunk on ``nthreads`` threads."""
    cdef double w = spfuse_chunk_work / LT_UNIT
    if w < 1.0:
        w = 1.0
    return <int64_t>(w * <double>nthreads)


cdef inline int64_t _next_step(int64_t step, int64_t iters, int64_t work,
                               int64_t nthreads) noexcept nogil:
    """Iterations of the next chunk: the target work at the work per
    iteration of the last chunk, between ``nthreads`` and LT_GROWTH times
    the last step."""
    cdef double per = <double>(work if work > 0 else 1) / <double>(iters if iters > 0 else 1)
    cdef double want = <double>_lt_chunk(nthreads) / per
    cdef double cap = <double>step * LT_GROWTH
    if want > cap:
        want = cap
    if want < <double>nthreads:
        want = <double>nthreads
    return <int64_t>want


cdef int64_t _run_parallel_chunk(Plan* P, Ctx* ctxs, Ctx* S, int64_t node, int64_t q,
                                 int64_t e, int nthreads, int64_t nc,
                                 int64_t nvars, int64_t nw) noexcept nogil:
    """Iterations ``[q, e)`` of a parallel top-level loop: contiguous static
    blocks, one per thread, then the threads' COO emissions appended to
    ``S``'s in thread (= iteration) order.  Returns the work done, -1 on
    error (out of memory)."""
    cdef int64_t t, c, n, nvar, w, work = e - q
    # (initialised: Cython makes them firstprivate in the parallel block)
    cdef int64_t a = 0, b = 0, chunk = 0
    cdef int tid = 0, nt = 1
    cdef Ctx* C
    for t in range(nthreads):
        ctxs[t].work = 0
    with parallel(num_threads=nthreads):
        tid = omp_get_thread_num()
        nt = omp_get_num_threads()
        chunk = (e - q + nt - 1) // nt
        a = q + tid * chunk
        b = a + chunk
        if b > e:
            b = e
        if a < b:
            # outer (serial) variable values are shared state
            memcpy(ctxs[tid].ival, S.ival, nvars * sizeof(int64_t))
            exec_loop_range(P, &ctxs[tid], node, a, b)
    for t in range(nthreads):
        C = &ctxs[t]
        if C.err:
            return -1
        work += C.work
        for c in range(nc):
            n = C.coo_n[c]
            if n == 0:
                continue
            nvar = P.coo_nvar[c]
            while S.coo_n[c] + n > S.coo_cap[c]:
                if coo_grow(S, c, nvar) != 0:
                    return -1
            memcpy(S.coo_crd[c] + S.coo_n[c] * nvar, C.coo_crd[c], n * nvar * sizeof(int64_t))
            memcpy(S.coo_val[c] + S.coo_n[c], C.coo_val[c], n * sizeof(double))
            S.coo_n[c] += n
            C.coo_n[c] = 0
        for w in range(nw):
            if _wso_append(&S.wso[w], &C.wso[w], P.coo_nvar[P.ws_coo[w]]) != 0:
                return -1
    return work


cdef inline void _reduce_block(Plan* P, Ctx* C, int64_t node, int64_t k, int64_t* cur,
                               const int64_t* stop, int64_t step, int64_t nred,
                               const int64_t* rb, double** parts, int64_t nr) noexcept nogil:
    """Block ``k``'s next ``step`` iterations of a reduction loop, summing
    into its partial copies (block 0 into the buffers themselves); a copy
    is filled with -0.0, the identity of ``+``, by its first round."""
    cdef int64_t i, j, a = cur[k]
    cdef int64_t e = stop[k] if stop[k] - a <= step else a + step
    cdef double* d
    for i in range(nr):
        if k > 0:
            d = parts[i * nred + k]
            if a == stop[k - 1]:        # its first round (an empty block's copy is filled too)
                for j in range(P.buf_size[rb[i]]):
                    d[j] = -0.0
            C.buf[rb[i]] = d
        else:
            C.buf[rb[i]] = parts[i * nred]
    if a >= e:
        return
    C.work = C.work + e - a
    exec_loop_range(P, C, node, a, e)
    cur[k] = e


cdef int64_t _run_reduce_round(Plan* P, Ctx* ctxs, Ctx* S, int64_t node, int64_t* cur,
                               const int64_t* stop, int64_t step, int64_t nred, int nthreads,
                               const int64_t* rb, double** parts, int64_t nr,
                               int64_t nvars) noexcept nogil:
    """One round of a reduction loop (``PAR_REDUCE``): each of its ``nred``
    fixed blocks runs its next ``step`` iterations (:func:`_reduce_block`);
    block k goes to thread ``k % nthreads``.  Which thread runs a block
    never changes what it adds, or in which order.  Returns the work done,
    -1 on error."""
    cdef int64_t k, work = 0
    cdef int tid = 0, nt = 1
    cdef Ctx* C
    if nthreads <= 1:
        S.work = 0
        for k in range(nred):
            _reduce_block(P, S, node, k, cur, stop, step, nred, rb, parts, nr)
        return -1 if S.err else S.work
    for k in range(nthreads):
        ctxs[k].work = 0
    with parallel(num_threads=nthreads):
        tid = omp_get_thread_num()
        nt = omp_get_num_threads()
        C = &ctxs[tid]
        memcpy(C.ival, S.ival, nvars * sizeof(int64_t))
        k = tid
        while k < nred:
            _reduce_block(P, C, node, k, cur, stop, step, nred, rb, parts, nr)
            k = k + nt
    for k in range(nthreads):
        if ctxs[k].err:
            return -1
        work += ctxs[k].work
    return work


cdef void _reduce_combine(const int64_t* rb, double** parts, int64_t nr, int64_t nred,
                          const int64_t* size, int nthreads) noexcept nogil:
    """Add each reduced buffer's partial copies (blocks 1..nred-1) into it,
    in block order for every element: the same sums on any thread count."""
    cdef int64_t i, k, j, lo, hi, n
    cdef int tid = 0, nt = 1
    cdef double* d
    cdef double x
    for i in range(nr):
        n = size[rb[i]]
        d = parts[i * nred]
        with parallel(num_threads=nthreads if nthreads > 1 and n >= 65536 else 1):
            tid = omp_get_thread_num()
            nt = omp_get_num_threads()
            lo = n * tid // nt
            hi = n * (tid + 1) // nt
            for j in range(lo, hi):
                x = d[j]
                for k in range(1, nred):
                    x = x + parts[i * nred + k][j]
                d[j] = x


cdef int _wso_append(WsOut* dst, WsOut* src, int64_t width) noexcept nogil:
    """Move ``src``'s entries and records to the end of ``dst``'s."""
    if src.rn == 0:
        return 0
    if wso_reserve(dst, src.n, src.rn, width) != 0:
        return -1
    memcpy(dst.k + dst.n, src.k, src.n * sizeof(int64_t))
    memcpy(dst.v + dst.n, src.v, src.n * sizeof(double))
    memcpy(dst.rec + dst.rn * width, src.rec, src.rn * width * sizeof(int64_t))
    dst.n += src.n
    dst.rn += src.rn
    src.n = 0
    src.rn = 0
    return 0


def _set_chunk_work(double units):
    """_set_chunk_work(units) -> previous value

    Testing hook: work units per thread per chunk (default 2**24, see
    ``_interrupt.pxd``; the interpreter counts ``units / LT_UNIT`` loop
    iterations; values < 1 only query).
    """
    return spfuse_set_chunk_work(units)


# ------------------------------------------------------------- program ----

cdef void _free_capsule(object cap) noexcept:
    free(PyCapsule_GetPointer(cap, NULL))


cdef cnp.ndarray _adopt(void** data, int64_t n, int typenum):
    """A 1-d array owning ``*data`` (``n`` items from ``malloc``): freed when
    the array dies; ``*data`` is set to NULL so the caller no longer frees it."""
    cdef cnp.npy_intp dims[1]
    cdef cnp.ndarray arr
    if n == 0 or data[0] == NULL:
        return np.empty(0, dtype=np.int64 if typenum == cnp.NPY_INT64 else np.float64)
    dims[0] = n
    arr = cnp.PyArray_SimpleNewFromData(1, dims, typenum, data[0])
    cap = PyCapsule_New(data[0], NULL, <PyCapsule_Destructor>_free_capsule)
    data[0] = NULL
    cnp.set_array_base(arr, cap)
    return arr


cdef inline int64_t* _ip(cnp.ndarray a):
    return <int64_t*>cnp.PyArray_DATA(a)


cdef inline double* _dp(cnp.ndarray a):
    return <double*>cnp.PyArray_DATA(a)


cdef inline idx_t* _xp(cnp.ndarray a):
    return <idx_t*>cnp.PyArray_DATA(a)


def _index(a):
    """An index array as this executor's index type, contiguous (the caller
    picks the executor whose type the operands already have: no copy)."""
    return np.ascontiguousarray(a, dtype=INDEX_DTYPE)


cdef inline bint _is_flat(object a, int typenum):
    """Whether ``a`` is already a 1-D C-contiguous native array of ``typenum``
    (what :func:`_index` / :func:`_f64` would return unchanged)."""
    return (type(a) is np.ndarray and cnp.PyArray_NDIM(<cnp.ndarray>a) == 1
            and cnp.PyArray_TYPE(<cnp.ndarray>a) == typenum
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a))


cdef tuple _flat_tuple(tuple arrays, int typenum, convert):
    """``arrays``, each passed through ``convert`` (:func:`_index` / :func:`_f64`)
    unless it already is what that returns."""
    cdef list out = list(arrays)
    cdef Py_ssize_t k
    for k in range(len(out)):
        if not _is_flat(out[k], typenum):
            out[k] = convert(out[k])
    return tuple(out)


def _i64(a):
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.ndim != 1:
        a = a.reshape(-1)
    return a


def _f64(a):
    a = np.ascontiguousarray(a, dtype=np.float64)
    if a.ndim != 1:
        a = a.reshape(-1)
    return a


def _fiber_loops(keep):
    """Per loop, 1 when block mode may run it fiber-wise (:func:`flush_fiber`):
    a block loop that is DENSE or has one driver, locates only dense levels
    and emits no COO output."""
    lt = np.zeros(len(keep["loop_var"]), dtype=np.int64)
    kind, levs, start = keep["lev_kind"], keep["loop_levs"], keep["loop_lev_start"]
    node_kind, node_arg, node_end = keep["node_kind"], keep["node_arg"], keep["node_end"]
    for node in range(len(node_kind)):
        if node_kind[node] != N_LOOP:
            continue
        lid = node_arg[node]
        if not keep["loop_block"][lid]:
            continue
        dense_mode = keep["loop_mode"][lid] == M_DENSE
        if not dense_mode and (keep["loop_mode"][lid] != M_INTERSECT or keep["loop_ndrv"][lid] != 1):
            continue
        mine = levs[start[lid]:start[lid] + keep["loop_nlev"][lid]]
        if any(kind[L] != L_DENSE for L in mine[0 if dense_mode else 1:]):
            continue
        if any(node_kind[c] == N_STMT and keep["stmt_tkind"][node_arg[c]] == T_COO
               for c in range(node + 1, node_end[node])):
            continue
        lt[lid] = 1
    return lt


def _stmt_buffer_reads(keep, s):
    """The buffer references a statement's byte code loads."""
    code, pc = keep["code"], keep["stmt_cstart"][s]
    end = pc + keep["stmt_clen"][s]
    out = []
    while pc < end:
        op = code[pc]
        if op <= OP_CONST:
            if op == OP_LOAD_BUF:
                out.append(int(code[pc + 1]))
            pc += 2
        else:
            pc += 1
    return out


def _leaf_parts(keep, node, mode):
    """``(loop levels, statement, code)`` of loop ``node`` when it can be a
    sweep's leaf -- a loop of ``mode`` whose only child is one statement
    ``target += x * y`` (two loads multiplied, summed into a buffer or a row
    workspace) -- else None.  The leaf kinds below
    (:func:`_dot_leaf` ...) check what else they need."""
    lid = keep["node_arg"][node]
    if keep["node_kind"][node] != N_LOOP or keep["loop_mode"][lid] != mode:
        return None
    if keep["node_end"][node] != node + 2 or keep["node_kind"][node + 1] != N_STMT:
        return None
    st = keep["loop_lev_start"][lid]
    mine = keep["loop_levs"][st:st + keep["loop_nlev"][lid]]
    s = int(keep["node_arg"][node + 1])
    code = keep["code"][keep["stmt_cstart"][s]:keep["stmt_cstart"][s] + keep["stmt_clen"][s]]
    if (keep["stmt_tkind"][s] not in (T_BUF, T_WS) or keep["stmt_op"][s] != A_SUM or len(code) != 5
            or code[0] > OP_CONST or code[2] > OP_CONST or code[4] != OP_MUL):
        return None
    return mine, s, code


def _target_size(keep, s):
    return keep["buf_size"][keep["bref_buf"][keep["stmt_target"][s]]]


def _dot_leaf(keep, node, parent):
    """A dense dot leaf: a DENSE loop over dense levels into ``T += a * b``
    with ``T`` 0-d and ``a``, ``b`` reading the loop's levels as their last
    levels.  Sweeps run it as one dot of two dense rows per fiber position."""
    parts = _leaf_parts(keep, node, M_DENSE)
    if parts is None:
        return -1
    mine, s, code = parts
    if (any(keep["lev_kind"][L] != L_DENSE for L in mine) or keep["stmt_tkind"][s] != T_BUF
            or code[0] != OP_LOAD_ACC or code[2] != OP_LOAD_ACC or _target_size(keep, s) != 1):
        return -1
    for r in (code[1], code[3]):
        L = keep["acc_last"][r]
        if L not in mine or keep["lev_parent"][L] < 0:
            return -1
    return s


def _gdot_leaf(keep, node, parent):
    """A sparse gather-dot leaf: one compressed driver whose parent level is
    ``parent`` (the enclosing fiber loop's driver), any other level it
    locates dense, into ``T[...] += a * v`` with ``a`` the driver's values,
    ``v`` a dense vector read at the coordinates and ``T`` a buffer or row
    workspace not indexed by the loop.  Sweeps run it as one gather-dot per
    position of the enclosing fiber (TTV's leaf)."""
    parts = _leaf_parts(keep, node, M_INTERSECT)
    if parts is None or keep["loop_ndrv"][keep["node_arg"][node]] != 1:
        return -1
    mine, s, code = parts
    Ld = mine[0]
    if (keep["lev_kind"][Ld] != L_COMPRESSED or keep["lev_parent"][Ld] != parent
            or any(keep["lev_kind"][L] != L_DENSE for L in mine[1:])
            or code[0] != OP_LOAD_ACC or code[2] != OP_LOAD_ACC):
        return -1
    t = keep["stmt_target"][s]
    t0 = keep["bref_tstart"][t]
    if keep["loop_var"][keep["node_arg"][node]] in keep["term_var"][t0:t0 + keep["bref_nterm"][t]]:
        return -1
    lasts = sorted([keep["acc_last"][code[1]], keep["acc_last"][code[3]]], key=lambda L: L != Ld)
    if lasts[0] != Ld or lasts[1] == Ld or lasts[1] not in mine or keep["lev_parent"][lasts[1]] >= 0:
        return -1
    return s


def _idot_leaf(keep, node, parent):
    """A sparse∩sparse dot leaf: an INTERSECT of exactly two compressed
    drivers and nothing else, into ``T += a * b`` with ``T`` 0-d and ``a``,
    ``b`` the two drivers' values.  Sweeps run it as one merge of the two
    fibers per position (masked SpGEMM by dot products)."""
    parts = _leaf_parts(keep, node, M_INTERSECT)
    lid = keep["node_arg"][node]
    if parts is None or keep["loop_ndrv"][lid] != 2 or keep["loop_nlev"][lid] != 2:
        return -1
    mine, s, code = parts
    if (any(keep["lev_kind"][L] != L_COMPRESSED for L in mine) or keep["stmt_tkind"][s] != T_BUF
            or code[0] != OP_LOAD_ACC or code[2] != OP_LOAD_ACC or _target_size(keep, s) != 1):
        return -1
    if sorted([keep["acc_last"][code[1]], keep["acc_last"][code[3]]]) != sorted(mine):
        return -1
    if any(keep["lev_parent"][L] < 0 for L in mine):
        # a tensor's first level (a sparse vector read under the sweep's
        # fibers) is one fiber for every position: not this leaf's (the
        # element walk runs it; read as a position's fiber it was garbage)
        return -1
    return s


def _axpy_leaf(keep, node, parent):
    """A dense axpy leaf: a DENSE loop over dense levels into ``T[..., k] +=
    x * b[..., k]`` with ``b`` reading the loop's level as its last level and
    ``x`` (a buffer, an access or a constant) not depending on the loop.
    Sweeps run it as one row update per fiber position (SpMM's leaf)."""
    parts = _leaf_parts(keep, node, M_DENSE)
    if parts is None:
        return -1
    mine, s, code = parts
    if any(keep["lev_kind"][L] != L_DENSE for L in mine) or keep["stmt_tkind"][s] != T_BUF:
        return -1
    v = keep["loop_var"][keep["node_arg"][node]]

    def uses_v(op, r):
        if op == OP_LOAD_ACC:
            return keep["acc_last"][r] in mine
        if op == OP_LOAD_BUF:
            t0 = keep["bref_tstart"][r]
            return v in keep["term_var"][t0:t0 + keep["bref_nterm"][r]]
        return False

    rows = [uses_v(code[0], code[1]), uses_v(code[2], code[3])]
    if sorted(rows) != [False, True]:
        return -1
    op, r = (code[0], code[1]) if rows[0] else (code[2], code[3])
    if op != OP_LOAD_ACC or keep["lev_parent"][keep["acc_last"][r]] < 0:
        return -1
    t = keep["stmt_target"][s]
    t0 = keep["bref_tstart"][t]
    if v not in keep["term_var"][t0:t0 + keep["bref_nterm"][t]]:
        return -1
    return s


def _saxpy_leaf(keep, node, parent):
    """A sparse scatter-axpy leaf: one compressed driver whose parent level
    is ``parent`` (the enclosing fiber loop's driver) and nothing else
    located, into ``T[..., k] += a * x`` with ``a`` the driver's values,
    ``x`` anything not read at the loop's coordinate and ``T`` a buffer
    indexed by the loop.  Sweeps run it as one scatter of the fiber under
    each position (TTV on a middle mode: ``A[i,k] += X[i,j,k] * c[j]``)."""
    parts = _leaf_parts(keep, node, M_INTERSECT)
    lid = keep["node_arg"][node]
    if parts is None or keep["loop_ndrv"][lid] != 1 or keep["loop_nlev"][lid] != 1:
        return -1
    mine, s, code = parts
    Ld = mine[0]
    if keep["lev_kind"][Ld] != L_COMPRESSED or keep["lev_parent"][Ld] != parent or keep["stmt_tkind"][s] != T_BUF:
        return -1
    v = keep["loop_var"][lid]

    def has_v(r):
        t0 = keep["bref_tstart"][r]
        return v in keep["term_var"][t0:t0 + keep["bref_nterm"][r]]

    loads = [(code[0], code[1]), (code[2], code[3])]
    driver = [op == OP_LOAD_ACC and keep["acc_last"][r] == Ld for op, r in loads]
    if sorted(driver) != [False, True]:
        return -1
    op, r = loads[driver.index(False)]
    if (op == OP_LOAD_BUF and has_v(r)) or not has_v(keep["stmt_target"][s]):
        return -1
    return s


#: The leaf kinds a sweep's fiber loop may hold, tried in this order.
_LEAVES = ((LEAF_DOT, _dot_leaf), (LEAF_AXPY, _axpy_leaf), (LEAF_GDOT, _gdot_leaf), (LEAF_IDOT, _idot_leaf),
           (LEAF_SAXPY, _saxpy_leaf))


def _fiber_children(keep, c, leaf, row_levels=()):
    """The children of fiber loop ``c`` as sweep entries ``(role, node,
    statement or reset, fiber var)``, or None when the loop cannot be swept:
    one compressed driver with every other level it locates dense, and only
    statements, position-temporary resets and dense dot/axpy leaves below it
    (their kinds go to ``leaf``); or, under a row sweep whose loop locates
    ``row_levels``, a merge of two compressed drivers of the row's fibers
    with only statements and resets below it."""
    kind, node_kind, node_arg, node_end = keep["lev_kind"], keep["node_kind"], keep["node_arg"], keep["node_end"]
    fl = node_arg[c]
    st = keep["loop_lev_start"][fl]
    mine = [int(L) for L in keep["loop_levs"][st:st + keep["loop_nlev"][fl]]]
    merge = (keep["loop_mode"][fl] == M_INTERSECT and keep["loop_ndrv"][fl] == 2 and len(mine) == 2
             and all(kind[L] == L_COMPRESSED and keep["lev_parent"][L] in row_levels for L in mine)
             and not any(node_kind[cc] == N_LOOP for cc in range(c + 1, node_end[c])))
    if not merge and not (keep["loop_mode"][fl] == M_INTERSECT and keep["loop_ndrv"][fl] == 1
                          and kind[mine[0]] == L_COMPRESSED and all(kind[L] == L_DENSE for L in mine[1:])):
        return None
    vf = keep["loop_var"][fl]
    out = []
    cc = c + 1
    while cc < node_end[c]:
        if node_kind[cc] == N_RESET:       # a position temporary's
            out.append(("preset", cc, node_arg[cc], vf))
        elif node_kind[cc] == N_LOOP:      # a leaf, run once per position
            for kind, detect in _LEAVES:
                s = detect(keep, cc, mine[0])
                if s >= 0:
                    leaf[node_arg[cc]] = kind
                    break
            else:
                return None
            out.append(("fiber", cc + 1, s, vf))
        elif node_kind[cc] == N_STMT:
            s = node_arg[cc]
            tk = keep["stmt_tkind"][s]
            if not (tk == T_BUF or tk == T_WS
                    or (tk == T_PATTERN and keep["pat_level"][keep["stmt_target"][s]] in mine[:1 + merge])):
                return None
            out.append(("fiber", cc, s, vf))
        else:
            return None
        cc = node_end[cc]
    return out


def _sweep_buffers(keep, private, order, o, vo, everywhere):
    """Whether the buffers referenced by sweep entries ``order`` (a sweep
    rooted at loop node ``o`` over rows of variable ``vo``, -1 for a sweep
    of one fiber loop's positions) keep the row-by-row walk's results: every
    buffer is a row temporary (0-d, reset per row), a position temporary
    (0-d, reset or assigned per position and used in that fiber loop only),
    written by one statement and never read here (updated in position
    order), or referenced by terms that all agree and move with the row.
    Returns ``(ok, row temporaries, position temporaries)``."""
    node_kind, node_end = keep["node_kind"], keep["node_end"]

    def terms(r):
        t0 = keep["bref_tstart"][r]
        return tuple(sorted((int(v), int(st)) for v, st in
                            zip(keep["term_var"][t0:t0 + keep["bref_nterm"][r]],
                                keep["term_stride"][t0:t0 + keep["bref_nterm"][r]])))

    refs: dict = {}   # buffer -> list of (role, terms, fiber var)
    first_ref: dict = {}
    first_at: dict = {}  # buffer -> the node that first sets it
    for role, n, x, vf in order:
        if role in ("reset", "preset"):
            b = int(keep["reset_buf"][x])
            first_ref.setdefault(b, role)
            first_at.setdefault(b, n)
            refs.setdefault(b, []).append((role, (), vf))
            continue
        for r in _stmt_buffer_reads(keep, x):
            b = int(keep["bref_buf"][r])
            first_ref.setdefault(b, "read")
            refs.setdefault(b, []).append(("read", terms(r), vf))
        t = keep["stmt_target"][x]
        if keep["stmt_tkind"][x] in (T_BUF, T_WS):
            b = int(keep["bref_buf"][t])
            if (role == "fiber" and b not in first_ref and keep["stmt_tkind"][x] == T_BUF and keep["stmt_op"][x] == A_ASSIGN
                    and keep["bref_nterm"][t] == 0):
                # a 0-d value assigned at each fiber position before any
                # read: a position temporary, like a reset one
                first_ref[b] = "preset"
                first_at[b] = n
                refs.setdefault(b, []).append(("preset", (), vf))
                continue
            first_ref.setdefault(b, "write")
            refs.setdefault(b, []).append(("write", terms(t), vf))
        else:
            b = int(keep["pat_buf"][t])
            first_ref.setdefault(b, "write")
            refs.setdefault(b, []).append(("write", ("pattern",), vf))
    temps, ptemps = [], []
    for b, rl in refs.items():
        writes = [t for role, t, _ in rl if role == "write"]
        resets = {role for role, _, _ in rl} & {"reset", "preset"}
        if resets:
            role = resets.pop()
            inside = {n for _, n, _, _ in order}
            if role == "preset":   # only inside the fiber loop that sets it
                at = first_at[b]
                fl = max((c for c in range(o + 1, at) if node_kind[c] == N_LOOP and node_end[c] > at),
                         default=o)
                inside = {n for n in inside if fl < n < node_end[fl]}
            ok = (not resets and first_ref[b] == role and all(t == () for _, t, _ in rl)
                  and bool(private[b]) and keep["buf_size"][b] == 1
                  and set(everywhere.get(b, ())) <= inside)
            (temps if role == "reset" else ptemps).append(b)
        elif not writes:
            continue
        elif len(writes) == 1 and all(role == "write" for role, _, _ in rl):
            continue  # one writer, never read here: updated in position order
        else:
            sig = {t for _, t, _ in rl}
            ok = (len(sig) == 1 and all(vf < 0 or all(v != vf for v, _ in t) for _, t, vf in rl)
                  and any(v == vo and st != 0 for v, st in next(iter(sig))))
        if not ok:
            return False, [], []
    return True, temps, ptemps


def _leaves_into_slots(keep, leaf, entries, slotted):
    """Does every dot leaf (dense or sparse∩sparse) of the sweep's
    ``entries`` add into a buffer that gets a sweep slot?  Those leaves
    accumulate into the slot's vector (``sw_t``); a target of size 1 that is
    not a sweep temporary -- a result ``y[i]`` whose loop has extent 1 --
    has none (its slot index -1 pointed the leaf's sums before the vector:
    nothing reached ``y``, and the heap was overwritten)."""
    for role, node, s, _ in entries:
        # a leaf's entry names the statement just inside its loop; a loop
        # holding other loops (the fiber loop) is never a leaf
        if (role == "fiber" and keep["node_kind"][node - 1] == N_LOOP
                and leaf[keep["node_arg"][node - 1]] in (LEAF_DOT, LEAF_IDOT)):
            if int(keep["bref_buf"][keep["stmt_target"][s]]) not in slotted:
                return False
    return True


def _sweep_loops(keep, private):
    """Per loop, how it runs as a sweep (see ``_sweep``): 0 not, SWEEP_ROWS
    (rows in batches, with fiber loops below), SWEEP_FIBER (one fiber loop
    over its positions in chunks, for loops not under a row sweep whose body
    has a dense leaf); per buffer, its slot in sweeps (-1: none) and whether
    that slot holds a value per fiber position (a position temporary) rather
    than per row; per dense loop under a fiber loop, its leaf.  Returns
    ``(loop_sweep, loop_leaf, buf_rslot, buf_postemp, n_slots)``."""
    nloops, nbuf = len(keep["loop_var"]), len(keep["buf_size"])
    sweep = np.zeros(nloops, dtype=np.int64)
    leaf = np.zeros(nloops, dtype=np.int64)   # per loop under a sweep: LEAF_DOT or LEAF_AXPY
    rslot = np.full(nbuf, -1, dtype=np.int64)
    postemp = np.zeros(nbuf, dtype=np.int64)
    kind = keep["lev_kind"]
    node_kind, node_arg, node_end = keep["node_kind"], keep["node_arg"], keep["node_end"]
    levs, start, nlev = keep["loop_levs"], keep["loop_lev_start"], keep["loop_nlev"]
    loop_var = keep["loop_var"]

    # every reference of every buffer in the plan: (node of its statement/reset, kind, ref)
    everywhere: dict = {}
    for node in range(len(node_kind)):
        if node_kind[node] == N_STMT:
            s = node_arg[node]
            for r in _stmt_buffer_reads(keep, s):
                everywhere.setdefault(int(keep["bref_buf"][r]), []).append(node)
            t = keep["stmt_target"][s]
            if keep["stmt_tkind"][s] == T_BUF:
                everywhere.setdefault(int(keep["bref_buf"][t]), []).append(node)
            elif keep["stmt_tkind"][s] == T_PATTERN:
                everywhere.setdefault(int(keep["pat_buf"][t]), []).append(node)
        elif node_kind[node] == N_RESET:
            everywhere.setdefault(int(keep["reset_buf"][node_arg[node]]), []).append(node)

    nslots = 0

    def take(lid, how, temps, ptemps):
        nonlocal nslots
        for b in temps + ptemps:
            if rslot[b] < 0:
                rslot[b] = nslots
                nslots += 1
            postemp[b] = b in ptemps
        sweep[lid] = how

    swept_until = -1   # nodes below a row sweep are not swept again
    for o in range(len(node_kind)):
        if node_kind[o] != N_LOOP or o < swept_until:
            continue
        lid = node_arg[o]
        if keep["loop_mode"][lid] != M_DENSE or keep["loop_block"][lid] or keep["loop_fiber"][lid]:
            continue
        vo = loop_var[lid]
        if any(kind[L] != L_DENSE for L in levs[start[lid]:start[lid] + nlev[lid]]):
            continue
        ok, fibers = True, 0
        order = []        # (kind, node, statement or reset, fiber var or -1)
        c = o + 1
        while c < node_end[o] and ok:
            k = node_kind[c]
            if k == N_RESET:
                r = node_arg[c]
                b = int(keep["reset_buf"][r])
                ok = bool(keep["reset_whole"][r]) and keep["buf_size"][b] == 1 and bool(private[b])
                order.append(("reset", c, r, -1))
            elif k == N_STMT:
                s = node_arg[c]
                ok = keep["stmt_tkind"][s] == T_BUF
                order.append(("stmt", c, s, -1))
            elif k != N_LOOP:
                ok = False
            else:
                entries = _fiber_children(keep, c, leaf, [int(L) for L in levs[start[lid]:start[lid] + nlev[lid]]])
                ok = entries is not None
                order.extend(entries or ())
                fibers += 1
            c = node_end[c]
        if not ok or (fibers == 0 and not any(k == "reset" for k, *_ in order)):
            continue
        ok, temps, ptemps = _sweep_buffers(keep, private, order, o, vo, everywhere)
        if ok and _leaves_into_slots(keep, leaf, order, temps + ptemps):
            take(lid, SWEEP_ROWS, temps, ptemps)
            swept_until = node_end[o]

    # fiber loops with a dense leaf, not under a row sweep: positions in chunks
    for c in range(len(node_kind)):
        if node_kind[c] != N_LOOP or sweep[node_arg[c]] or any(
                sweep[node_arg[o]] == SWEEP_ROWS and o < c < node_end[o]
                for o in range(c) if node_kind[o] == N_LOOP):
            continue
        if not any(node_kind[cc] == N_LOOP for cc in range(c + 1, node_end[c])):
            continue
        entries = _fiber_children(keep, c, leaf)
        if entries is None:
            continue
        ok, temps, ptemps = _sweep_buffers(keep, private, entries, c, -1, everywhere)
        if ok and not temps and _leaves_into_slots(keep, leaf, entries, ptemps):
            take(node_arg[c], SWEEP_FIBER, temps, ptemps)
    return sweep, leaf, rslot, postemp, nslots


_INT_FIELDS = (
    "node_kind", "node_end", "node_arg",
    "loop_var", "loop_mode", "loop_lev_start", "loop_ndrv", "loop_nlev", "loop_levs", "loop_block",
    "var_extent", "lev_kind", "lev_size", "lev_parent", "lev_pos_arr", "lev_crd_arr",
    "acc_last", "acc_vals_arr",
    "bref_buf", "bref_tstart", "bref_nterm", "term_var", "term_stride",
    "stmt_tkind", "stmt_target", "stmt_op", "stmt_cstart", "stmt_clen",
    "pat_buf", "pat_level", "coo_nvar", "coo_vstart", "coo_vars",
    "ws_buf", "ws_coo", "ws_extent", "ws_pos", "buf_ws",
    "reset_buf", "reset_whole", "reset_tstart", "reset_nbound", "reset_nfree",
    "rterm_a", "rterm_b", "buf_size", "code", "top_parallel", "buf_reduce",
)


cdef class _Program:
    """A plan's arrays pinned as C pointers (built once per :func:`run`)."""
    cdef Plan P
    cdef dict keep
    cdef int64_t nlev, nacc, nvars, nbuf, ncoo, nws, nnodes, max_free, max_stack, max_blk_lev, n_rslots
    cdef bint any_block, any_sweep
    cdef tuple index_arrays, value_arrays

    def __cinit__(self):
        self.P.lev_pos = NULL
        self.P.lev_crd = NULL
        self.P.acc_vals = NULL

    def __init__(self, plan, bint blocks=True):
        cdef int64_t k, j
        keep = {}
        for f in _INT_FIELDS:
            keep[f] = _i64(getattr(plan, f))
        if not blocks:
            keep["loop_block"] = np.zeros_like(keep["loop_block"])
        keep["loop_fiber"] = _fiber_loops(keep)
        keep["loop_sweep"], keep["loop_leaf"], keep["buf_rslot"], keep["buf_postemp"], self.n_rslots = _sweep_loops(
            keep, [bool(x) for x in plan.buf_private])
        self.any_sweep = bool(keep["loop_sweep"].any())
        self.max_stack = max(1, int(plan.max_stack))
        self.max_blk_lev = int(keep["loop_nlev"].max()) if len(keep["loop_nlev"]) else 0
        keep["reset_value"] = _f64(plan.reset_value)
        keep["consts"] = _f64(plan.consts)
        self.keep = keep
        self.index_arrays = tuple(_index(a) for a in plan.index_arrays)
        self.value_arrays = tuple(_f64(a) for a in plan.value_arrays)
        self.nlev = len(keep["lev_kind"])
        self.nacc = len(keep["acc_last"])
        self.nvars = len(keep["var_extent"])
        self.nbuf = len(keep["buf_size"])
        self.ncoo = len(keep["coo_nvar"])
        self.nws = len(keep["ws_buf"])
        self.nnodes = len(keep["node_kind"])
        self.max_free = int(keep["reset_nfree"].max()) if len(keep["reset_nfree"]) else 0
        P = &self.P
        P.node_kind = _ip(keep["node_kind"]); P.node_end = _ip(keep["node_end"])
        P.node_arg = _ip(keep["node_arg"])
        P.loop_var = _ip(keep["loop_var"]); P.loop_mode = _ip(keep["loop_mode"])
        P.loop_lev_start = _ip(keep["loop_lev_start"]); P.loop_ndrv = _ip(keep["loop_ndrv"])
        P.loop_nlev = _ip(keep["loop_nlev"]); P.loop_levs = _ip(keep["loop_levs"])
        P.loop_block = _ip(keep["loop_block"])
        P.loop_fiber = _ip(keep["loop_fiber"])
        P.loop_sweep = _ip(keep["loop_sweep"])
        P.buf_rslot = _ip(keep["buf_rslot"])
        P.buf_postemp = _ip(keep["buf_postemp"])
        P.loop_leaf = _ip(keep["loop_leaf"])
        self.any_block = bool(keep["loop_block"].any())
        P.var_extent = _ip(keep["var_extent"])
        P.lev_kind = _ip(keep["lev_kind"]); P.lev_size = _ip(keep["lev_size"])
        P.lev_parent = _ip(keep["lev_parent"])
        P.acc_last = _ip(keep["acc_last"])
        P.bref_buf = _ip(keep["bref_buf"]); P.bref_tstart = _ip(keep["bref_tstart"])
        P.bref_nterm = _ip(keep["bref_nterm"]); P.term_var = _ip(keep["term_var"])
        P.term_stride = _ip(keep["term_stride"])
        P.stmt_tkind = _ip(keep["stmt_tkind"]); P.stmt_target = _ip(keep["stmt_target"])
        P.stmt_op = _ip(keep["stmt_op"]); P.stmt_cstart = _ip(keep["stmt_cstart"])
        P.stmt_clen = _ip(keep["stmt_clen"])
        P.pat_buf = _ip(keep["pat_buf"]); P.pat_level = _ip(keep["pat_level"])
        P.coo_nvar = _ip(keep["coo_nvar"]); P.coo_vstart = _ip(keep["coo_vstart"])
        P.coo_vars = _ip(keep["coo_vars"])
        P.ws_buf = _ip(keep["ws_buf"]); P.ws_coo = _ip(keep["ws_coo"])
        P.ws_extent = _ip(keep["ws_extent"]); P.buf_ws = _ip(keep["buf_ws"])
        P.ws_pos = _ip(keep["ws_pos"])
        P.reset_buf = _ip(keep["reset_buf"]); P.reset_whole = _ip(keep["reset_whole"])
        P.reset_tstart = _ip(keep["reset_tstart"]); P.reset_nbound = _ip(keep["reset_nbound"])
        P.reset_nfree = _ip(keep["reset_nfree"]); P.rterm_a = _ip(keep["rterm_a"])
        P.rterm_b = _ip(keep["rterm_b"]); P.reset_value = _dp(keep["reset_value"])
        P.buf_size = _ip(keep["buf_size"]); P.code = _ip(keep["code"])
        P.consts = _dp(keep["consts"])
        P.lev_pos = <idx_t**>calloc(self.nlev + 1, sizeof(idx_t*))
        P.lev_crd = <idx_t**>calloc(self.nlev + 1, sizeof(idx_t*))
        P.acc_vals = <double**>calloc(self.nacc + 1, sizeof(double*))
        if P.lev_pos == NULL or P.lev_crd == NULL or P.acc_vals == NULL:
            raise MemoryError()
        pos_arr = keep["lev_pos_arr"]
        crd_arr = keep["lev_crd_arr"]
        for k in range(self.nlev):
            j = pos_arr[k]
            if j >= 0:
                P.lev_pos[k] = _xp(self.index_arrays[j])
            j = crd_arr[k]
            if j >= 0:
                P.lev_crd[k] = _xp(self.index_arrays[j])
        vals_arr = keep["acc_vals_arr"]
        for k in range(self.nacc):
            P.acc_vals[k] = _dp(self.value_arrays[vals_arr[k]])

    def with_arrays(self, tuple index_arrays, tuple value_arrays, buf_size):
        """This program over other operand arrays (same structure, as
        :meth:`spfuse.lowering.looptree.LoweredProgram.rebind` makes them):
        only the pointer tables are rebuilt; the structure is shared.
        Runs on every cached call, so arrays already in the executor's
        dtype are taken without a Python-level conversion."""
        cdef _Program q = _Program.__new__(_Program)
        cdef int64_t k, j
        q.P = self.P
        if buf_size is self.keep["buf_size"]:
            q.keep = self.keep  # nothing of the structure changes: share it
        else:
            q.keep = dict(self.keep)
            q.keep["buf_size"] = _i64(buf_size)
            q.P.buf_size = _ip(q.keep["buf_size"])
        q.nlev, q.nacc, q.nvars, q.nbuf = self.nlev, self.nacc, self.nvars, self.nbuf
        q.ncoo, q.nnodes, q.max_free, q.max_stack = self.ncoo, self.nnodes, self.max_free, self.max_stack
        q.nws = self.nws
        q.max_blk_lev, q.n_rslots = self.max_blk_lev, self.n_rslots
        q.any_block, q.any_sweep = self.any_block, self.any_sweep
        q.index_arrays = _flat_tuple(index_arrays, INDEX_TYPENUM, _index)
        q.value_arrays = _flat_tuple(value_arrays, cnp.NPY_FLOAT64, _f64)
        q.P.lev_pos = <idx_t**>calloc(self.nlev + 1, sizeof(idx_t*))
        q.P.lev_crd = <idx_t**>calloc(self.nlev + 1, sizeof(idx_t*))
        q.P.acc_vals = <double**>calloc(self.nacc + 1, sizeof(double*))
        if q.P.lev_pos == NULL or q.P.lev_crd == NULL or q.P.acc_vals == NULL:
            raise MemoryError()
        cdef int64_t* pos_arr = _ip(self.keep["lev_pos_arr"])
        cdef int64_t* crd_arr = _ip(self.keep["lev_crd_arr"])
        for k in range(self.nlev):
            j = pos_arr[k]
            if j >= 0:
                q.P.lev_pos[k] = _xp(q.index_arrays[j])
            j = crd_arr[k]
            if j >= 0:
                q.P.lev_crd[k] = _xp(q.index_arrays[j])
        cdef int64_t* vals_arr = _ip(self.keep["acc_vals_arr"])
        for k in range(self.nacc):
            q.P.acc_vals[k] = _dp(q.value_arrays[vals_arr[k]])
        return q

    def __dealloc__(self):
        free(self.P.lev_pos)
        free(self.P.lev_crd)
        free(self.P.acc_vals)

    cdef _reduce_loop(self, Ctx* ctxs, Ctx* S, int64_t node, int64_t lo, int64_t hi,
                      int nthreads, int64_t nred, list bufs):
        """Top-level loop ``node`` over ``[lo, hi)`` as ``nred`` fixed blocks
        of iterations run in interruptible rounds: block 0 sums into the
        buffers reduced there, each other block into its own partial copy
        (:func:`_reduce_block`), and the copies are added in block order."""
        cdef Plan* P = &self.P
        cdef int64_t* red = _ip(self.keep["buf_reduce"])
        cdef int64_t b, i, k, nr, step, work, n = hi - lo
        reduced = [b for b in range(self.nbuf) if red[b] == node]
        nr = len(reduced)
        parts = [np.empty((nred - 1, P.buf_size[b])) for b in reduced]
        cdef int64_t* rb = <int64_t*>malloc((nr + 1) * sizeof(int64_t))
        cdef int64_t* cur = <int64_t*>malloc(2 * nred * sizeof(int64_t))
        cdef double** pp = <double**>malloc((nr * nred + 1) * sizeof(double*))
        if rb == NULL or cur == NULL or pp == NULL:
            free(rb); free(cur); free(pp)
            raise MemoryError()
        cdef int64_t* stop = cur + nred
        cdef int nt = nthreads if nthreads > 1 else 1
        try:
            for i in range(nr):
                rb[i] = reduced[i]
                pp[i * nred] = _dp(bufs[rb[i]])
                for k in range(1, nred):
                    pp[i * nred + k] = _dp(parts[i][k - 1])
            for k in range(nred):
                cur[k] = lo + n * k // nred
                stop[k] = lo + n * (k + 1) // nred
            step = nt
            while True:
                with nogil:
                    work = _run_reduce_round(P, ctxs, S, node, cur, stop, step, nred, nthreads,
                                             rb, pp, nr, self.nvars)
                if work < 0:
                    raise MemoryError("loop-tree executor: out of memory in a reduction loop")
                k = 0
                while k < nred and cur[k] >= stop[k]:
                    k += 1
                if k == nred:
                    break
                PyErr_CheckSignals()
                step = _next_step(step, step * nred, work, nt)
            with nogil:
                _reduce_combine(rb, pp, nr, nred, P.buf_size, nthreads)
        finally:
            for i in range(nr):     # the contexts point at the shared buffers again
                S.buf[rb[i]] = _dp(bufs[rb[i]])
                for k in range(nthreads):
                    ctxs[k].buf[rb[i]] = _dp(bufs[rb[i]])
            free(rb); free(cur); free(pp)

    def execute(self, list buffers, list private_flags, int nthreads, int64_t reduce_blocks=1):
        """Run every top-level node in order.

        ``buffers``: one flat float64 array per plan buffer, initialised by the
        caller and written in place.  ``reduce_blocks``: how many fixed
        blocks a reduction loop (``PAR_REDUCE``) is cut into, whatever the
        thread count, so that its sums are the same on any number of
        threads.  Returns, per COO output, a pair ``(coords (n, nvar)
        int64, values (n,) float64)`` in emission order.
        """
        cdef int64_t nctx = nthreads + 1           # ctx[nthreads] = serial
        cdef int64_t t, b, c, node, lo, hi, nvar, n, q, e, step, work
        cdef int nt, err = 0
        cdef bint done, par
        cdef Ctx* ctxs
        cdef Ctx* C
        cdef Ctx* S
        cdef Plan* P = &self.P
        cdef int64_t nb = self.nbuf, nc = self.ncoo, nn = self.nnodes, nw = self.nws, w
        cdef WsOut* o
        cdef int64_t* toppar = _ip(self.keep["top_parallel"])
        cdef bint any_par = nthreads > 1 and bool(self.keep["top_parallel"].any())
        cdef int64_t* bufsz = P.buf_size
        cdef bint* priv
        cdef double** shared
        cdef int64_t* scratch
        # (a line of gap between threads' scratch: their cursors never share a cache line)
        cdef int64_t per = padded_stride(5 * self.nlev + self.nvars + self.max_free + 1, sizeof(int64_t))
        if len(buffers) != nb:
            raise ValueError("buffer count mismatch")
        bufs = buffers
        for b in range(nb):
            x = buffers[b]
            if not _is_flat(x, cnp.NPY_FLOAT64) or cnp.PyArray_DIM(<cnp.ndarray>x, 0) != bufsz[b]:
                raise ValueError(f"buffer {b} must be a contiguous float64 array of size {bufsz[b]}")
        if not any_par:
            nctx = 1
            nthreads = 0
        # each thread's copy of a private buffer starts on its own 64-byte
        # line with a line of gap after it: the copies of a small buffer (a
        # scalar or a 16-wide row temporary) written in the innermost loop
        # would otherwise share cache lines between threads (false sharing
        # made 2 threads slower than 1)
        private_copies = []
        private_stride = []
        if any_par:
            for b in range(nb):
                if private_flags[b]:
                    private_stride.append(((bufsz[b] + 7) // 8 + 1) * 8)
                    private_copies.append(np.empty(nthreads * private_stride[b] + 8))
                else:
                    private_stride.append(0)
                    private_copies.append(None)
        ctxs = <Ctx*>calloc(nctx, sizeof(Ctx))
        scratch = <int64_t*>calloc(nctx * per, sizeof(int64_t))
        priv = <bint*>calloc(nb + 1, sizeof(bint))
        shared = <double**>calloc(nb + 1, sizeof(double*))
        if ctxs == NULL or scratch == NULL or priv == NULL or shared == NULL:
            free(ctxs); free(scratch); free(priv); free(shared)
            raise MemoryError()
        try:
            for b in range(nb):
                priv[b] = bool(private_flags[b])
                shared[b] = _dp(bufs[b])
            for t in range(nctx):
                C = &ctxs[t]
                C.ival = scratch + t * per
                C.curpos = C.ival + self.nvars
                C.cur = C.curpos + self.nlev
                C.cend = C.cur + self.nlev
                C.base = C.cend + self.nlev
                C.odo = C.base + self.nlev
                C.buf = <double**>calloc(nb + 1, sizeof(double*))
                C.coo_crd = <int64_t**>calloc(nc + 1, sizeof(int64_t*))
                C.coo_val = <double**>calloc(nc + 1, sizeof(double*))
                C.coo_n = <int64_t*>calloc(nc + 1, sizeof(int64_t))
                C.coo_cap = <int64_t*>calloc(nc + 1, sizeof(int64_t))
                C.ws_bits = <uint64_t**>calloc(nw + 1, sizeof(uint64_t*))
                C.ws_words = <uint64_t**>calloc(nw + 1, sizeof(uint64_t*))
                C.ws_lo = <int64_t*>malloc((nw + 1) * sizeof(int64_t))
                C.ws_hi = <int64_t*>malloc((nw + 1) * sizeof(int64_t))
                C.wso = <WsOut*>calloc(nw + 1, sizeof(WsOut))
                if C.ws_bits == NULL or C.ws_words == NULL or C.ws_lo == NULL or C.ws_hi == NULL \
                        or C.wso == NULL:
                    raise MemoryError()
                for w in range(nw):
                    C.ws_lo[w] = -1
                    C.ws_hi[w] = -1
                    C.ws_bits[w] = <uint64_t*>calloc(((P.ws_extent[w] + 63) >> 6) + 1, sizeof(uint64_t))
                    C.ws_words[w] = <uint64_t*>calloc(((P.ws_extent[w] + 4095) >> 12) + 1, sizeof(uint64_t))
                    if C.ws_bits[w] == NULL or C.ws_words[w] == NULL:
                        raise MemoryError()
                if self.any_block:
                    C.blk_i = <int64_t*>malloc(BLK * (self.max_blk_lev + 1) * sizeof(int64_t))
                    C.blk_pos = C.blk_i + BLK if C.blk_i != NULL else NULL
                    C.vst = <double*>malloc(BLK * self.max_stack * sizeof(double))
                    if C.blk_i == NULL or C.vst == NULL:
                        raise MemoryError()
                if self.any_sweep:
                    C.sw_rowid = <int64_t*>malloc((6 * SW + 1) * sizeof(int64_t))
                    C.sw_crd = <idx_t*>malloc(SW * sizeof(idx_t))
                    C.sw_q = <double*>malloc(2 * SW * self.max_stack * sizeof(double))
                    C.sw_r = C.sw_q + SW * self.max_stack if C.sw_q != NULL else NULL
                    C.sw_t = <double*>malloc(SW * (self.n_rslots + 1) * sizeof(double))
                    if C.sw_rowid == NULL or C.sw_crd == NULL or C.sw_q == NULL or C.sw_t == NULL:
                        raise MemoryError()
                if C.buf == NULL or C.coo_crd == NULL or C.coo_val == NULL or C.coo_n == NULL or C.coo_cap == NULL:
                    raise MemoryError()
                for b in range(nb):
                    if t < nthreads and priv[b]:
                        C.buf[b] = _dp(private_copies[b]) + (-(<intptr_t>_dp(private_copies[b]) >> 3) & 7) \
                            + t * <int64_t>private_stride[b]
                    else:
                        C.buf[b] = shared[b]
            S = &ctxs[nctx - 1]
            node = 0
            while node < nn and err == 0:
                if P.node_kind[node] != N_LOOP:
                    # STMT / RESET at top level: one bounded step
                    with nogil:
                        exec_node(P, S, node)
                    err = S.err
                elif P.loop_mode[P.node_arg[node]] == M_UNION:
                    # (never parallel) resumed from its merge cursors per chunk
                    c = 0
                    done = False
                    while not done:
                        if c > 0:
                            PyErr_CheckSignals()
                        with nogil:
                            S.work = 0
                            done = exec_union_part(P, S, node, c > 0, _lt_chunk(1))
                        err = S.err
                        if err:
                            break
                        c += 1
                elif loop_range(P, S, node, &lo, &hi) and toppar[node] == PAR_REDUCE \
                        and reduce_blocks > 1 and hi - lo >= reduce_blocks:
                    self._reduce_loop(ctxs, S, node, lo, hi, nthreads, reduce_blocks, bufs)
                elif loop_range(P, S, node, &lo, &hi):
                    par = nthreads > 1 and toppar[node] == PAR_ROWS and hi - lo > 1
                    nt = nthreads if par else 1
                    if par:
                        for b in range(nb):
                            if priv[b]:
                                for t in range(nthreads):
                                    memcpy(ctxs[t].buf[b], shared[b], bufsz[b] * sizeof(double))
                    # chunks of consecutive iterations [q, e): one per thread first,
                    # then sized from the work per iteration counted so far
                    q = lo
                    step = nt
                    while q < hi:
                        if q > lo:
                            PyErr_CheckSignals()
                        e = hi if hi - q <= step else q + step
                        if par:
                            with nogil:
                                work = _run_parallel_chunk(P, ctxs, S, node, q, e, nthreads,
                                                           nc, self.nvars, nw)
                            err = work < 0
                        else:
                            with nogil:
                                S.work = e - q
                                exec_loop_range(P, S, node, q, e)
                            work = S.work
                            err = S.err
                        if err:
                            break
                        step = _next_step(step, e - q, work, nt)
                        q = e
                node = P.node_end[node]
            if err:
                raise MemoryError("loop-tree executor: out of memory growing a COO output")
            out = []
            for c in range(nc):
                nvar = P.coo_nvar[c]
                n = S.coo_n[c]
                crd = np.empty((n, nvar), dtype=np.int64)
                val = np.empty(n, dtype=np.float64)
                if n > 0:
                    if nvar > 0:
                        memcpy(cnp.PyArray_DATA(crd), S.coo_crd[c], n * nvar * sizeof(int64_t))
                    memcpy(cnp.PyArray_DATA(val), S.coo_val[c], n * sizeof(double))
                out.append((crd, val))
            for w in range(nw):   # rows of the workspace outputs replace their (empty) COO lists
                o = &S.wso[w]
                nvar = P.coo_nvar[P.ws_coo[w]]
                # handed over, not copied: a fresh copy of ~16 bytes per entry
                # costs as much again in page faults as the assembly itself
                rec = _adopt(<void**>&o.rec, o.rn * nvar, cnp.NPY_INT64).reshape(o.rn, nvar)
                ks = _adopt(<void**>&o.k, o.n, cnp.NPY_INT64)
                val = _adopt(<void**>&o.v, o.n, cnp.NPY_FLOAT64)
                out[P.ws_coo[w]] = (rec, ks, val)
            return out
        finally:
            for t in range(nctx):
                C = &ctxs[t]
                if C.coo_crd != NULL:
                    for c in range(nc):
                        free(C.coo_crd[c])
                        free(C.coo_val[c])
                if C.ws_bits != NULL:
                    for w in range(nw):
                        free(C.ws_bits[w])
                if C.ws_words != NULL:
                    for w in range(nw):
                        free(C.ws_words[w])
                if C.wso != NULL:
                    for w in range(nw):
                        free(C.wso[w].k); free(C.wso[w].v); free(C.wso[w].rec)
                free(C.ws_bits); free(C.ws_words); free(C.ws_lo); free(C.ws_hi); free(C.wso)
                free(C.blk_i); free(C.vst); free(C.sw_rowid); free(C.sw_crd); free(C.sw_q); free(C.sw_t)
                free(C.buf); free(C.coo_crd); free(C.coo_val); free(C.coo_n); free(C.coo_cap)
            free(ctxs); free(scratch); free(priv); free(shared)
