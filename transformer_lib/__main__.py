"""`python -m transformer_lib …` runs the command line (transformer_lib.translation.cli)."""

import sys

from transformer_lib.translation.cli import main

if __name__ == "__main__":
    sys.exit(main())
