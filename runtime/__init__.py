"""edgefn runtime: HTTP front, router, isolate executors, deploy store and CLI."""

__version__ = "0.1.0"
