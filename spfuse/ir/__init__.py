"""Intermediate representation: unit operations, iteration masks, index trees,
and the dependence DAG (ReACT section 4.1)."""
