"""Langfuse at the edge: the attribute mapping, the scores, and reading traces back through its public API."""
