"""What `looptrace replay` and its `--all` table share: the detector flags, the limits, the tools, one replay."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looptrace.cli.common import UsageError

if TYPE_CHECKING:
    from looptrace.instrumentation.detector import DetectorConfig
    from looptrace.replay import Replay
    from looptrace.runtime import Limits, Tool

# The detector settings a what-if can change, as flags: (flag, DetectorConfig field, what it is).
DETECTOR_FLAGS = (
    ("--repeat-threshold", "repeat_threshold", "identical calls without progress that make a repeated_call"),
    ("--repeat-window", "repeat_window", "turns in which identical failing calls count, other calls between"),
    ("--cycle-repeats", "cycle_repeats", "rounds of a pattern (A B A B ...) that make a cycle"),
    ("--cycle-max-period", "cycle_max_period", "the longest pattern a cycle may have"),
    ("--failing-tool-threshold", "failing_tool_threshold", "failing turns of one tool that make a failing_tool "
                                                            "(0: off)"),
)


def run_replay(recorded: Any, args: argparse.Namespace, *, tools: list[Tool] | None,
               detector: DetectorConfig | None) -> Replay:
    """``replay.replay`` with the command's limits and policy. No settings of the environment's go in: a replay
    records nothing and alerts no one, so none of them apply (and a bad one must not stop it)."""
    from looptrace.replay import replay

    try:
        return replay(recorded, tools=tools, limits=limits_for(recorded, args), on_anomaly=args.on_anomaly,
                      detector=detector)
    except ValueError as exc:  # a limit the Agent refuses (a cost budget for a model without a price)
        raise UsageError(str(exc)) from None


def limits_for(recorded: Any, args: argparse.Namespace) -> Limits:
    """The replay's limits: the recorded run's ending limit (``replay.replay_limits``), with the flags over it."""
    from looptrace.replay import replay_limits

    given = {"max_turns": args.max_turns, "max_total_tokens": args.max_total_tokens,
             "max_cost_usd": args.max_cost_usd}
    return dataclasses.replace(replay_limits(recorded), **{k: v for k, v in given.items() if v is not None})


def detector_config(args: argparse.Namespace) -> DetectorConfig | None:
    """The detector's settings with the flags over its defaults; None when no flag was given."""
    from looptrace.instrumentation.detector import DetectorConfig

    given = {field: getattr(args, field) for _, field, _ in DETECTOR_FLAGS if getattr(args, field) is not None}
    if not given:
        return None
    try:
        return DetectorConfig(**given)
    except ValueError as exc:
        raise UsageError(str(exc).removeprefix("DetectorConfig: ")) from None


def detector_changes(args: argparse.Namespace) -> str:
    """The detector flags given, as ``repeat_threshold=4``; "defaults" when none."""
    given = [f"{field}={getattr(args, field)}" for _, field, _ in DETECTOR_FLAGS if getattr(args, field) is not None]
    return ", ".join(given) or "defaults"


def tools_of(args: argparse.Namespace) -> list[Tool] | None:
    if not args.tools:
        return None
    from looptrace.cli.run_command import load_tools

    return load_tools(Path(args.tools))


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value
