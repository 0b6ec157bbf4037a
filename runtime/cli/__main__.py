"""`python -m runtime.cli` runs the `edgefn` command."""

import sys

from runtime.cli.main import main

sys.exit(main())
