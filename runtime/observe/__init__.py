"""What the PoP tells its operator: one `Event` per request (the ``events`` stage),
Prometheus metrics, health, traces. Everything here is fed by the events stage
through `Observer.observe`, after the response has been sent (a stream: when it
ends)."""
