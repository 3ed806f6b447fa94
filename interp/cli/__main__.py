"""`python -m interp.cli` (and `torchrun -m interp.cli`): the `interp` command."""
import sys

from interp.cli import main

sys.exit(main())
