"""What configure() or the embedded default attached to a tracer provider they built, looked up by a run's provider.

A run finds its anomaly sinks and its Langfuse trace links through the provider its spans are made with, whoever
built the `Agent`. The keys are weak: a provider that is gone takes what was attached to it along.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerProvider(Generic[T]):
    """One value per tracer provider."""

    def __init__(self) -> None:
        self._values: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()

    def attach(self, tracer_provider: Any, value: T) -> None:
        self._values[tracer_provider] = value

    def of(self, tracer_provider: Any) -> T | None:
        try:
            return self._values.get(tracer_provider)
        except TypeError:  # a provider that cannot be weakly referenced never had anything attached
            return None
