"""The live dashboard on the admin listener: a rolling aggregator of events
(`aggregator`), one-time login tokens and sessions (`login`), and the page and
its SSE stream (`serve`, static files under ``static/``)."""
