"""The `edgefn` command line: `main` builds the parser; commands import what they need lazily."""
