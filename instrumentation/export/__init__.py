"""Where spans and metrics go: configure(), the SDK's exporters built from Settings, the guard that keeps a backend's
trouble away from the agent, and ``push`` for what a backend could not take."""
