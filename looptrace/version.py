"""looptrace's version, in a module of its own: the runtime records it in a paused run's state without importing the
package's public face (which names the runtime itself)."""

__version__ = "0.3.0"
