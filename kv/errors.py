"""The kv exception tree; messages name the namespace, key or index involved."""


class KVError(Exception):
    """Base of every error kv raises on purpose."""


class Closed(KVError):
    """The store or index was used after `close()`."""


class UnknownNamespace(KVError):
    """A namespace or index that was never created."""


class NotFound(KVError):
    """A key or id that does not exist where one is required."""


class LimitExceeded(KVError):
    """A key, value, metadata or batch over its size limit."""


class InvalidValue(KVError):
    """A value of the wrong shape: a non-integer to increment, a bad cursor, a vector
    of the wrong dimension."""
