"""Passes over the IR.  Each is a pure function: IR in, new IR out."""
