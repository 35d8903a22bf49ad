"""Who may send spans to watch: the bearer token or the basic-auth pair of `WatchSettings`, if either is set."""

from __future__ import annotations

import base64
import hmac

from .settings import WatchSettings


def authorized(header: str | None, settings: WatchSettings) -> bool:
    """Whether an Authorization header carries the configured token or credentials. Constant-time comparisons."""
    if not settings.requires_auth:
        return True
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if settings.bearer_token is not None and scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), settings.bearer_token.encode())
    if settings.basic_auth is not None and scheme.lower() == "basic":
        expected = base64.b64encode(":".join(settings.basic_auth).encode()).decode()
        return hmac.compare_digest(value.encode(), expected.encode())
    return False
