"""One module per pipeline stage; `runtime.pipeline.build` makes them from config."""
