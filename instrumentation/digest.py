"""A short, stable fingerprint of a tool result.

Recorded on every execute_tool span even when content capture is off, so the detector can tell "the same result
again" from stored traces that hold no content. Live and offline detection must compute it the same way: this module
is the only place it is defined.
"""

import hashlib


def result_digest(text: str | None) -> str:
    if text is None:
        return ""
    return hashlib.blake2b(text.encode("utf-8", errors="surrogatepass"), digest_size=8).hexdigest()
