"""What to try looptrace with, offline: a tools file for `looptrace run --tools`, and scripts that stand in for the
model (`--model scripted:equipment`, `--model scripted:notes`), so that `run`, `resume`, the approval questions and
`run --mcp` work without an API key or a network. See docs/cli.md ("Trying it without a key").
"""
