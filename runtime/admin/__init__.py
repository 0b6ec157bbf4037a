"""The admin API (loopback, bearer token) and the client the CLI uses to reach it."""
