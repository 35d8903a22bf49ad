"""The one place the CLI reads the environment.

The CLI is an entry point: each command reads looptrace's settings once (``read_settings``, the CLI's only
``Settings.from_env()``), puts its flags over them and passes the result down, so that nothing below needs to read
the environment. The two other variables the CLI looks at are not looptrace's: the Anthropic SDK's credentials,
checked before a run so that a missing key is one line, and NO_COLOR (no-color.org).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from looptrace.cli.common import UsageError

if TYPE_CHECKING:
    from looptrace.instrumentation import Settings
    from looptrace.instrumentation.export import Telemetry


def read_settings(**flags: Any) -> Settings:
    """The environment's settings with the command's flags over them (``Settings.with_overrides``: a flag left unset,
    None, keeps the environment's value). A value the settings refuse is a usage error, said in one line."""
    # Imported here: the trace commands call this only when they need a default path, and start without it.
    from looptrace.instrumentation import ConfigurationError, Settings

    try:
        settings = Settings.from_env().with_overrides(**flags)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    if settings.ignored:  # a value that cannot be used is said here, once, naming its variable
        from looptrace.instrumentation import settings_ignored

        settings_ignored(settings.ignored)
    return settings


def no_trace_file_reason(telemetry: Telemetry, chosen_by: str | None) -> str:
    """Why a run wrote no trace file, naming what decided it: OTEL_SDK_DISABLED, the --exporter flag, or the variable
    that chose the exporters."""
    settings = telemetry.settings
    if settings.telemetry_disabled:
        return "telemetry is disabled by OTEL_SDK_DISABLED"
    where = chosen_by or settings.exporters_variable or "the exporters chosen"
    return f"the file exporter is not among {where}"


def anthropic_credentials_set() -> bool:
    """Whether the anthropic SDK will find a key or a token (it reads them itself; the CLI only checks first)."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))


def check_anthropic_environment() -> None:
    """What the anthropic SDK will need, checked before a run starts: a key or a token, and an ANTHROPIC_BASE_URL it
    can send to (a malformed one would otherwise surface as a connection error after the run began)."""
    from looptrace.instrumentation import http_url_problem

    if not anthropic_credentials_set():
        raise UsageError("ANTHROPIC_API_KEY is not set; export it "
                         "(and ANTHROPIC_BASE_URL for a proxy or a local server), or try the offline model: "
                         "--model scripted:equipment (docs/cli.md)")
    base_url = (os.environ.get("ANTHROPIC_BASE_URL") or "").strip()
    if base_url:
        problem = http_url_problem("ANTHROPIC_BASE_URL", base_url, "https://api.anthropic.com (or your proxy's "
                                   "URL, e.g. http://localhost:8080)")
        if problem:
            raise UsageError(problem)


def no_color_requested() -> bool:
    """NO_COLOR set to anything but the empty string turns colour off (no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))
