"""Recording a run: OpenTelemetry spans with the GenAI conventions, the instrumented model, content capture and
redaction, metrics, and the one place backends' attribute mappings are applied."""
