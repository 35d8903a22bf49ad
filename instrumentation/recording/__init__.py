"""Recording a run: OpenTelemetry spans with the GenAI conventions and looptrace.* (no backend's attributes: their
exporters add them, ``export.mapped``), the instrumented model, content capture and redaction, metrics, and the
protocols of what the spans hand on (``sinks``: anomaly sinks, trace links), which the layers above implement.
Imports none of alerts, langfuse or export."""
