"""Static checks: names, arities, extents, result shapes."""
import re

import numpy as np
import pytest

from spfuse.errors import ProgramError
from spfuse.frontend.ast import Access, Assignment, Binary, Program, Reduce
from spfuse.frontend.check import check_program, result_shapes, shape_of
from spfuse.frontend.parser import parse, parse_program


def test_extents_per_statement():
    p = parse_program("T[i,k] = A[i,j] * B[j,k]\ny[i] = T[i,k] * x[k]\nz[j] = T[j,i]")
    shapes = {"A": (2, 3), "B": (3, 4), "x": (4,)}
    assert check_program(p, shapes) == [{"i": 2, "j": 3, "k": 4}, {"i": 2, "k": 4},
                                        {"j": 2, "i": 4}]
    assert result_shapes(p, shapes) == {"T": (2, 4), "y": (2,), "z": (2,)}


def test_same_index_name_may_differ_between_statements():
    p = parse_program("y[i] = A[i]; z[i] = B[i]")
    assert check_program(p, {"A": (2,), "B": (5,)}) == [{"i": 2}, {"i": 5}]


def test_shapes_from_arrays_and_extra_names():
    p = parse_program("s = A[i,j]")
    assert check_program(p, {"A": np.zeros((2, 0)), "unused": (1,)}) == [{"i": 2, "j": 0}]
    assert result_shapes(p, {"A": np.zeros((2, 0))}) == {"s": ()}


def test_diagonal_extents():
    p = parse_program("d[i] = A[i,i]")
    assert check_program(p, {"A": (3, 3)}) == [{"i": 3}]
    with pytest.raises(ProgramError, match="index 'i' has extent 3 in A.* but extent 4") as e:
        check_program(p, {"A": (3, 4)})
    assert e.value.position == p.text.rindex("i]")


def test_zero_d_operands():
    p = parse_program("y[i] = a * x[i] + b[]")
    assert result_shapes(p, {"a": (), "b": (), "x": (3,)}) == {"y": (3,)}


def _err(text, shapes, message, at, occurrence=0):
    """Assert check_program raises ``message`` with the caret at the
    ``occurrence``-th occurrence of ``at`` in ``text``."""
    p = parse_program(text)
    with pytest.raises(ProgramError, match=message) as e:
        check_program(p, shapes)
    positions = [m.start() for m in re.finditer(re.escape(at), text)]
    assert e.value.position == positions[occurrence], str(e.value)
    caret_line = str(e.value).splitlines()[-1]
    line_start = text.rfind("\n", 0, e.value.position) + 1
    assert caret_line.index("^") - 2 == e.value.position - line_start
    assert isinstance(e.value, ValueError)
    return str(e.value)


def test_unknown_operand():
    msg = _err("y[i] = A[i,j] * z[j]", {"A": (2, 3)}, "unknown operand 'z'", "z[j]")
    assert "known names: A" in msg


def test_read_before_assignment():
    _err("y[i] = T[i]\nT[i] = A[i]", {"A": (2,)}, "reading 'T' before it is assigned", "T[i]")
    _err("T[i] = T[i] + A[i]", {"A": (2,)}, "reading 'T' before it is assigned", "T[i]", 1)


def test_wrong_arity():
    msg = _err("y[i] = B[i]", {"B": (2, 3)}, "'B' has 2 dimension", "B[i]")
    assert "B[i] gives 1 index" in msg
    _err("y[i] = x[i] * s[i]", {"x": (2,), "s": ()}, "'s' has 0 dimension", "s[i]")
    _err("y = T[i]; z = y[j]", {"T": (2,)}, "'y' has 0 dimension", "y[j]")


def test_inconsistent_extents():
    msg = _err("C[i,j] = A[i,j] * B[i,j]", {"A": (2, 3), "B": (2, 4)},
               "index 'j' has extent 3 in A", "j]", 2)
    assert "extent 3 in A[i, j] (axis 1) but extent 4 in B[i, j] (axis 1)" in msg
    _err("C[i,k] = A[i,j] * B[j,k]", {"A": (2, 3), "B": (4, 5)},
         "index 'j' has extent 3 in A.*axis 1.* extent 4 in B.*axis 0", "j,k]")


def test_assigned_twice():
    _err("y[i] = A[i]\ny[i] = A[i] * 2", {"A": (2,)}, "'y' is assigned twice", "y[i]", 1)


def test_input_shadowing():
    msg = _err("A[i] = A[i] * 2", {"A": (2,)}, "'A' is an input operand", "A[i]")
    assert "Hint" in msg


def test_reduction_index_on_left():
    # not reachable through parse_program (which rejects it first); check a bare parse
    text = "y[i] = max(i, A[i])"
    with pytest.raises(ProgramError, match="reduction index 'i' also appears on the left") as e:
        check_program(parse(text), {"A": (2,)})
    assert e.value.position == text.index("i,")


def test_reduction_index_unused():
    text = "y[i] = A[i] + sum(k, 2)"
    with pytest.raises(ProgramError, match="reduction index 'k' is not used") as e:
        check_program(parse_program(text), {"A": (2,)})
    assert e.value.position == text.index("k,")


def test_output_index_unbound_without_reduction_pass():
    with pytest.raises(ProgramError, match="output index 'j' is not bound") as e:
        check_program(parse("y[i,j] = A[i]"), {"A": (2,)})
    assert e.value.position == 4


def test_program_without_text_has_no_caret():
    p = Program((Assignment(Access("y", ("i",)),
                            Binary("*", Access("A", ("i",)), Access("B", ("i",)))),))
    with pytest.raises(ProgramError, match="index 'i'") as e:
        check_program(p, {"A": (2,), "B": (3,)})
    assert e.value.position is None and "^" not in str(e.value)
    p = Program((Assignment(Access("y", ()), Reduce("sum", "i", Access("A", ("i",)))),))
    assert check_program(p, {"A": (4,)}) == [{"i": 4}]


def test_shape_of():
    assert shape_of([2, 3]) == (2, 3)
    assert shape_of(np.zeros(())) == ()
    with pytest.raises(TypeError, match="expected a shape"):
        shape_of(3.0)
    with pytest.raises(ValueError, match="negative"):
        shape_of((2, -1))
