"""Front end: lexer, parser, implicit reductions, printing, canonical keys."""
import re

import pytest
from hypothesis import given, settings

from spfuse.errors import ProgramError
from spfuse.frontend.ast import Access, Assignment, Binary, Literal, Reduce, Span, Unary, Where
from spfuse.frontend.canonical import canonical_key, to_text
from spfuse.frontend.lexer import tokenize
from spfuse.frontend.parser import parse, parse_expression, parse_program
from spfuse.frontend.reductions import free_indices, make_reductions_explicit
from spfuse.testing import programs


def A(name, *idx):
    return Access(name, tuple(idx))


def B(op, left, right):
    return Binary(op, left, right)


def S(k, body, op="sum"):
    return Reduce(op, k, body)


def L(v):
    return Literal(float(v))


def caret(exc_info):
    """(position, the rendered caret line's column) of a ProgramError."""
    err = exc_info.value
    lines = str(err).splitlines()
    return err.position, lines[-1].index("^") - 2


# ---------------------------------------------------------------------------
# expressions: text → AST (no implicit-reduction pass)
# ---------------------------------------------------------------------------
EXPRESSIONS = [
    ("A[i,j]", A("A", "i", "j")),
    ("A[ i , j ]", A("A", "i", "j")),
    ("A[]", A("A")),
    ("x", A("x")),
    ("2", L(2)),
    ("2.5", L(2.5)),
    (".5", L(0.5)),
    ("1e3", L(1000)),
    ("1.5E-2", L(0.015)),
    ("a + b - c", B("-", B("+", A("a"), A("b")), A("c"))),
    ("a - (b - c)", B("-", A("a"), B("-", A("b"), A("c")))),
    ("a * b / c", B("/", B("*", A("a"), A("b")), A("c"))),
    ("a + b * c", B("+", A("a"), B("*", A("b"), A("c")))),
    ("(a + b) * c", B("*", B("+", A("a"), A("b")), A("c"))),
    ("-a", Unary("neg", A("a"))),
    ("--a", Unary("neg", Unary("neg", A("a")))),
    ("-a * b", B("*", Unary("neg", A("a")), A("b"))),
    ("a * -b", B("*", A("a"), Unary("neg", A("b")))),
    ("-2", Unary("neg", L(2))),
    ("neg(a)", Unary("neg", A("a"))),
    ("relu(A[i] + 1)", Unary("relu", B("+", A("A", "i"), L(1)))),
    *[(f"{fn}(x)", Unary(fn, A("x")))
      for fn in ("relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt")],
    ("where(c[i], a[i], 0)", Where(A("c", "i"), A("a", "i"), L(0))),
    ("sum(k, C[i,k])", S("k", A("C", "i", "k"))),
    ("max(k, C[i,k])", S("k", A("C", "i", "k"), "max")),
    ("min(k, C[i,k] * 2)", S("k", B("*", A("C", "i", "k"), L(2)), "min")),
    ("sum(i, j, A[i,j])", S("i", S("j", A("A", "i", "j")))),
    ("sum(i, x)", S("i", A("x"))),
    ("sum(i, j)", S("i", A("j"))),  # body is the 0-d operand j
    ("exp[i] + sum[j]", B("+", A("exp", "i"), A("sum", "j"))),  # tensors named like functions
    ("A[i,i]", A("A", "i", "i")),
    ("(\n a\n + b)", B("+", A("a"), A("b"))),  # newlines inside brackets are blanks
]


@pytest.mark.parametrize("text,expected", EXPRESSIONS, ids=[t for t, _ in EXPRESSIONS])
def test_expression_structure(text, expected):
    assert parse_expression(text) == expected
    assert parse(f"out = {text}").statements[0].value == expected


def test_statements_separators_comments():
    p = parse("# header\n\nT[i] = a[i]  # first\n;; y = T[i] ; z[] = 2\n\n")
    assert p.statements == (
        Assignment(A("T", "i"), A("a", "i")),
        Assignment(A("y"), A("T", "i")),
        Assignment(A("z"), L(2)),
    )
    assert p.assigned == ("T", "y", "z")
    assert p.inputs == ("a",)
    assert p.results == ("y", "z")


def test_spans():
    text = "C[i,k] = A[i,j] * (B[j,k] + 1)"
    st = parse(text).statements[0]
    assert st.target.span == Span(0, 6)
    assert st.target.index_spans == (Span(2, 3), Span(4, 5))
    a = st.value.left
    assert text[a.span.start:a.span.end] == "A[i,j]"
    assert [text[s.start:s.end] for s in a.index_spans] == ["i", "j"]
    plus = st.value.right
    assert text[plus.span.start:plus.span.end] == "B[j,k] + 1"
    assert text[st.value.span.start:st.value.span.end] == text[9:]
    assert st.span == Span(0, len(text))
    red = parse("y = sum(i, j, A[i,j])").statements[0].value
    assert red.span.start == 4 and red.body.span.start == 11  # inner reduce starts at 'j'


def test_lexer_tokens():
    kinds = [t[0] for t in tokenize("a[i]=-1.5e+3/b;\n# c\nc=d")]
    assert kinds == ["name", "[", "name", "]", "=", "-", "number", "/", "name", "newline",
                     "name", "=", "name", "eof"]


# ---------------------------------------------------------------------------
# syntax errors: message and caret column
# ---------------------------------------------------------------------------
SYNTAX_ERRORS = [
    ("y[i] = A[i j]", "expected ',' or ']'", "j]"),
    ("y[i] = A[i,", "expected an index name", ""),
    ("y[i] = A[i,2]", "expected an index name", "2]"),
    ("y[i] = A[i", "expected ',' or ']'", ""),
    ("y[i] A[i]", "expected '='", "A[i]"),
    ("y[i] = ", "expected an expression", ""),
    ("y[i] = A[i] +", "expected an expression", ""),
    ("y[i] = (A[i] + 1", "expected ')'", ""),
    ("y[i] = A[i])", "expected an operator or the end", ")"),
    ("y[i] = A[i] B[i]", "expected an operator or the end", "B[i]"),
    ("y[i] = foo(A[i])", "unknown function 'foo'", "foo"),
    ("y[i] = relu(A[i], 2)", "takes exactly one argument", ", 2)"),
    ("y[i] = where(A[i], 1)", "where() takes three arguments", ")"),
    ("y[i] = sum(A[i,j])", "expected an index name as the first argument", "A[i,j]"),
    ("y[i] = sum(j, A[i,j]", "expected ')'", ""),
    ("y[i] = A[i] $ 2", "unexpected character '$'", "$"),
    ("y[i,i] = A[i]", "index 'i' repeated on the left", "i] ="),
    ("2 = x", "expected the name of the assigned tensor", "2 ="),
    ("", "no statements", ""),
    ("  # only a comment\n", "no statements", None),
    ("y = x\nz[i] = = 3", "expected an expression", "= 3"),
]


@pytest.mark.parametrize("text,message,at", SYNTAX_ERRORS, ids=[t for t, _, _ in SYNTAX_ERRORS])
def test_syntax_errors(text, message, at):
    with pytest.raises(ProgramError, match=re.escape(message)) as e:
        parse(text)
    assert isinstance(e.value, ValueError)
    pos, col = caret(e)
    expected = 0 if at is None else (len(text) if at == "" else text.rindex(at))
    assert pos == expected
    line_start = text.rfind("\n", 0, pos) + 1
    assert col == pos - line_start


def test_error_on_second_line_shows_that_line():
    with pytest.raises(ProgramError) as e:
        parse("a = b\nc[i] = d[i j]")
    lines = str(e.value).splitlines()
    assert lines[-2] == "  c[i] = d[i j]"
    assert lines[-1] == "  " + " " * 11 + "^"


# ---------------------------------------------------------------------------
# implicit reductions
# ---------------------------------------------------------------------------
REDUCTIONS = [
    ("y[i] = A[i,j] * x[j]", S("j", B("*", A("A", "i", "j"), A("x", "j")))),
    ("A[i,j] = B[i,j] / (C[i,k]*D[k,j])",
     B("/", A("B", "i", "j"), S("k", B("*", A("C", "i", "k"), A("D", "k", "j"))))),
    ("A[i,j] = B[i,j] * (C[i,k]*D[k,j])",
     B("*", A("B", "i", "j"), S("k", B("*", A("C", "i", "k"), A("D", "k", "j"))))),
    ("Z[i,j] = A[i,k]*X[k,h]*W[h,j]",
     S("h", B("*", S("k", B("*", A("A", "i", "k"), A("X", "k", "h"))), A("W", "h", "j")))),
    ("s = A[i,j] * B[i,j]", S("i", S("j", B("*", A("A", "i", "j"), A("B", "i", "j"))))),
    ("s = B[j,i] * A[i,j]", S("j", S("i", B("*", A("B", "j", "i"), A("A", "i", "j"))))),
    ("t = A[i,i]", S("i", A("A", "i", "i"))),
    ("y[i] = relu(A[i,k])", Unary("relu", S("k", A("A", "i", "k")))),
    ("y[i] = A[i,k] + x[i]", B("+", S("k", A("A", "i", "k")), A("x", "i"))),
    ("y[i] = A[i,k] + B[i,k]", S("k", B("+", A("A", "i", "k"), A("B", "i", "k")))),
    ("y[i] = where(c[k], A[i,k], 0)", S("k", Where(A("c", "k"), A("A", "i", "k"), L(0)))),
    # explicit reductions bind; other free uses of the same name are separate
    ("y[i] = max(k, A[i,k])", S("k", A("A", "i", "k"), "max")),
    ("y[i] = sum(k, A[i,k]) * B[i,k]",
     B("*", S("k", A("A", "i", "k")), S("k", A("B", "i", "k")))),
    ("y[i] = max(j, A[i,j] * C[j,k] * x[k])",
     S("j", S("k", B("*", B("*", A("A", "i", "j"), A("C", "j", "k")), A("x", "k"))), "max")),
    ("y[i] = max(j, A[i,j] * (C[j,k] * x[k]))",
     S("j", B("*", A("A", "i", "j"), S("k", B("*", A("C", "j", "k"), A("x", "k")))), "max")),
    ("y[i] = x[i] + 1", B("+", A("x", "i"), L(1))),
]


@pytest.mark.parametrize("text,expected", REDUCTIONS, ids=[t for t, _ in REDUCTIONS])
def test_implicit_reductions(text, expected):
    p = parse_program(text)
    assert p.statements[0].value == expected
    # idempotent, and implicit reductions are flagged
    assert make_reductions_explicit(p) is p
    implicit = [r.implicit for r in _reduces(p.statements[0].value)]
    explicit_count = text.count("sum(") + text.count("max(") + text.count("min(")
    assert implicit.count(False) == explicit_count


def _reduces(e):
    if isinstance(e, Reduce):
        yield e
    for c in (getattr(e, f, None) for f in ("left", "right", "arg", "body", "cond", "then", "other")):
        if c is not None:
            yield from _reduces(c)


def test_reductions_per_statement():
    p = parse_program("T[i,k] = A[i,j]*B[j,k]\ny[i] = T[i,k]*x[k]")
    assert [to_text(s) for s in p.statements] == [
        "T[i, k] = sum(j, A[i, j] * B[j, k])", "y[i] = sum(k, T[i, k] * x[k])"]


def test_unbound_output_index_error():
    text = "A[i,j] = B[i,k]*C[k]"
    with pytest.raises(ProgramError, match="output index 'j' is not bound on the right") as e:
        parse_program(text)
    assert caret(e) == (4, 4)


def test_reduction_over_output_index_error():
    text = "y[i] = sum(i, A[i])"
    with pytest.raises(ProgramError, match="reduction index 'i' also appears on the left") as e:
        parse_program(text)
    assert e.value.position == text.index("i,")
    text = "y[i] = sum(k, i, A[i,k])"
    with pytest.raises(ProgramError, match="reduction index 'i'") as e:
        parse_program(text)
    assert e.value.position == text.index("i, A")


def test_free_indices():
    assert free_indices(parse_expression("sum(j, A[i,j] * x[j]) + B[k,i]")) == ("i", "k")


# ---------------------------------------------------------------------------
# printing and canonical keys
# ---------------------------------------------------------------------------
PRINTED = [
    ("y[i] = A[i,j] * x[j]", "y[i] = sum(j, A[i, j] * x[j])"),
    ("s = a - (b - c)", "s = a - (b - c)"),
    ("s = (a - b) - c", "s = a - b - c"),
    ("s = a / (b * c)", "s = a / (b * c)"),
    ("s = a * (b * c)", "s = a * (b * c)"),
    ("s = -(a + b) * -c", "s = -(a + b) * -c"),
    ("s = --a", "s = --a"),
    ("s = neg(2)", "s = -2.0"),
    ("s = sum(i, j, A[i, j])", "s = sum(i, j, A[i, j])"),
    ("s = max(i, sum(j, A[i, j]))", "s = max(i, sum(j, A[i, j]))"),
    ("z[] = where(c, 1e-5, x)", "z = where(c, 1e-05, x)"),
    ("z = exp[i] * sum", "z = sum(i, exp[i]) * sum"),
]


@pytest.mark.parametrize("text,printed", PRINTED, ids=[t for t, _ in PRINTED])
def test_to_text(text, printed):
    p = parse_program(text)
    assert to_text(p) == printed
    assert parse(printed) == p


def test_to_text_nodes_and_literals():
    assert to_text(A("A", "i", "j")) == "A[i, j]"
    assert to_text(Assignment(A("s"), L(3))) == "s = 3.0"
    assert parse_expression(to_text(L(-2))) == Unary("neg", L(2))
    with pytest.raises(ValueError, match="no text form"):
        to_text(L(float("inf")))


@settings(max_examples=300, deadline=None)
@given(programs(max_depth=4))
def test_round_trip(program_and_shapes):
    p, _ = program_and_shapes
    text = to_text(p)
    assert parse(text) == p
    assert to_text(parse(text)) == text
    explicit = parse_program(text)
    assert explicit == make_reductions_explicit(p)
    assert parse(to_text(explicit)) == explicit


def test_canonical_key_equal():
    same = ["C[i,k] = A[i,j]*B[j,k]", "C[a,c] = A[a,b]*B[b,c]", "C[x, y]=A[x,z] * B[z,y]  # c",
            "C[i,k] = sum(j, A[i,j]*B[j,k])"]
    keys = {canonical_key(parse_program(t)) for t in same}
    assert keys == {"C[i0, i1] = sum(i2, A[i0, i2] * B[i2, i1])"}


def test_canonical_key_per_statement():
    a = parse_program("T[i,j] = A[i,j]; y[j] = T[j,i]")
    b = parse_program("T[p,q] = A[p,q]; y[r] = T[r,s]")
    assert canonical_key(a) == canonical_key(b) == "T[i0, i1] = A[i0, i1]; y[i0] = sum(i1, T[i0, i1])"


@pytest.mark.parametrize("a,b", [
    ("C[i,k] = A[i,j]*B[j,k]", "C[i,k] = A[i,j]*B[k,j]"),       # transposed operand
    ("C[i,k] = A[i,j]*B[j,k]", "C[k,i] = A[i,j]*B[j,k]"),       # transposed result
    ("C[i,k] = A[i,j]*B[j,k]", "C[i,k] = B[i,j]*A[j,k]"),       # names matter
    ("y[i] = A[i,j]*x[j]", "y[i] = A[i,j]+x[j]"),
    ("y[i] = sum(j, A[i,j])", "y[i] = max(j, A[i,j])"),
    ("y[i] = A[i,i]", "y[i] = A[i,j]"),
    ("s = a - b - c", "s = a - (b - c)"),
    ("s = 2 * a", "s = 3 * a"),
])
def test_canonical_key_differs(a, b):
    assert canonical_key(parse_program(a)) != canonical_key(parse_program(b))
