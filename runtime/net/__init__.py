"""HTTP/1.1 front: an asyncio protocol on the httptools parser, no WSGI/ASGI."""

from runtime.net.message import Request, Response, json_response, text_response
from runtime.net.server import Server, ServerConfig

__all__ = ["Request", "Response", "Server", "ServerConfig", "json_response", "text_response"]
