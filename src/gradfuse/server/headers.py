"""Headers every response carries so that a browser cannot be turned against the page: no MIME sniffing, no
framing (clickjacking), no referrer, and on the page and its files a Content-Security-Policy that runs only this
server's own scripts (the page escapes everything it shows; this is the second wall). Inline style attributes stay
allowed: the page's bars and swatches are drawn with them."""

from __future__ import annotations

PAGE_POLICY = ("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_EVERY = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"))


class SecurityHeaders:
    """ASGI middleware adding the headers above (the policy on `/` and `/static/...`; the API docs keep their
    own inline start-up script)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        page = scope["path"] == "/" or scope["path"].startswith("/static/")

        async def with_headers(message):
            if message["type"] == "http.response.start":
                extra = [*_EVERY, *([(b"content-security-policy", PAGE_POLICY.encode())] if page else [])]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
