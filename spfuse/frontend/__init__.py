"""Front end: program text (index notation or einsum subscripts) → checked AST."""
