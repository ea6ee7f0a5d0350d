"""Front end: program text (index notation or einsum subscripts) → checked AST.

>>> from spfuse.frontend import parse_program, to_text
>>> to_text(parse_program("y[i] = A[i,j] * x[j]"))
'y[i] = sum(j, A[i, j] * x[j])'
"""
from spfuse.frontend.canonical import canonical_key, to_text
from spfuse.frontend.check import check_program, result_shapes
from spfuse.frontend.einsum import einsum_to_program
from spfuse.frontend.parser import parse, parse_program

__all__ = ["parse", "parse_program", "einsum_to_program", "check_program", "result_shapes",
           "to_text", "canonical_key"]
