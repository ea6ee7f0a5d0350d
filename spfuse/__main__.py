"""``python -m spfuse``: the command line of :mod:`spfuse.cli`."""
import sys

from spfuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
