"""Runs rebuilt from stored or received spans (looptrace's and other producers'), judged by the same detector as a
live run: what `looptrace detect`, `watch` and `replay` read."""
