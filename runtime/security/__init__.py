"""The edge security layer: API keys and JWTs, the WAF, the bot manager and rate
limits. The pipeline stages in `runtime.pipeline.stages` are thin; the engines live here."""
