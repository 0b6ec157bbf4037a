"""Python isolates: pre-warmed subinterpreters inside supervised host processes.

`wire` is stdlib-only: it is imported inside the subinterpreters too.
"""
