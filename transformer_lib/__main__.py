"""`python -m transformer_lib …` runs the command line (see transformer_lib.cli)."""

import sys

from transformer_lib.cli import main

if __name__ == "__main__":
    sys.exit(main())
