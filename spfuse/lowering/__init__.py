"""Lowering: a planned index tree + the call's operands → an executable plan
of plain data (a template-kernel call or a generic loop-tree plan)."""
