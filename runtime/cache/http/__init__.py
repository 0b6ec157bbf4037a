"""An RFC 9111 shared cache of function responses (the ``http_cache`` stage)."""
