"""What a `looptrace report` page says, read back, and what `looptrace detect --json --all` says of the same file, in
the same shape: the report's tests compare the two.

``figures_of_page`` reads the page's HTML (the ``data-*`` attributes beside each figure it shows);
``figures_of_detect`` sums `detect`'s JSON lines the way the page is documented to (docs/report.md).
"""

from __future__ import annotations

import json
from collections import Counter
from html.parser import HTMLParser
from typing import Any

SEVERAL_TOOLS = "(several tools)"
NOT_RECORDED = "not recorded"


class _Elements(HTMLParser):
    """Every element as (tag, attributes, text inside it), in document order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = {"tag": tag, "attrs": {k: v or "" for k, v in attrs}, "text": "", "parents": list(self._open)}
        self.elements.append(element)
        if tag not in ("meta", "input", "br", "img", "link", "path", "line"):
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index]["tag"] == tag:
                del self._open[index:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element["text"] += data


def elements(html: str) -> list[dict[str, Any]]:
    parser = _Elements()
    parser.feed(html)
    return parser.elements


def _within(element: dict[str, Any], tag: str, **attrs: str) -> bool:
    return any(p["tag"] == tag and all(p["attrs"].get(k) == v for k, v in attrs.items()) for p in element["parents"])


def figures_of_page(html: str) -> dict[str, Any]:
    """The overview's figures as the page states them (its data-* attributes)."""
    found = elements(html)
    kpis = {e["attrs"]["data-kpi"]: float(e["attrs"]["data-value"]) for e in found if "data-kpi" in e["attrs"]}
    statuses = {e["attrs"]["data-status"]: int(e["attrs"]["data-value"]) for e in found
                if e["tag"] == "li" and "data-value" in e["attrs"] and "data-status" in e["attrs"]}

    def table(name: str) -> dict[str, list[float]]:
        rows: dict[str, list[float]] = {}
        for element in found:
            if element["tag"] == "tr" and "data-name" in element["attrs"] and _within(element, "table", id=name):
                rows[element["attrs"]["data-name"]] = []
        for element in found:
            if element["tag"] == "td" and "data-value" in element["attrs"] and _within(element, "table", id=name):
                row = next(p for p in reversed(element["parents"]) if p["tag"] == "tr")
                rows[row["attrs"]["data-name"]].append(float(element["attrs"]["data-value"]))
        return rows

    top = [(e["attrs"]["data-trace-id"], e["attrs"]["data-type"], int(e["attrs"]["data-tokens"]),
            float(e["attrs"]["data-usd"]) if e["attrs"]["data-usd"] else None)
           for e in found if e["tag"] == "tr" and _within(e, "table", id="top-loops") and "data-type" in e["attrs"]]
    return {"runs": int(kpis["runs"]), "looped": int(kpis["looped"]), "anomalies": int(kpis["anomalies"]),
            "loop_tokens": int(kpis["loop-tokens"]), "loop_usd": round(kpis["loop-usd"], 6),
            "unresolved": int(kpis["unresolved"]), "statuses": statuses,
            "agents": {name: [int(v[0]), int(v[1]), int(v[2]), int(v[3]), round(v[4], 6)]
                       for name, v in table("agents").items()},
            "tools": {name: [int(v[1]), int(v[2]), int(v[3]), round(v[4], 6)] for name, v in table("tools").items()},
            "top_loops": top}


def figures_of_detect(lines: str) -> dict[str, Any]:
    """`detect --json --all`'s verdicts summed as the page sums runs (each verdict one run)."""
    verdicts = [json.loads(line) for line in lines.splitlines() if line.strip()]
    agents: dict[str, list[float]] = {}
    tools: dict[str, list[float]] = {}
    ranked = []
    for order, verdict in enumerate(verdicts):
        name = verdict["name"].removeprefix("invoke_agent ") or "?"
        cost = verdict["loop_cost"] or {}
        row = agents.setdefault(name, [0, 0, 0, 0, 0.0])
        row[0] += 1
        if verdict["anomalies"]:
            row[1] += 1
            row[2] += len(verdict["anomalies"])
            row[3] += cost.get("total_tokens", 0)
            row[4] += cost.get("usd") or 0.0
        on_tool: dict[str, list[dict[str, Any]]] = {}
        for anomaly in verdict["anomalies"]:
            on_tool.setdefault(anomaly["tool"] or SEVERAL_TOOLS, []).append(anomaly)
            spent = anomaly["cost"] or {}
            ranked.append(((spent.get("usd") if spent.get("usd") is not None else -1.0, spent.get("total_tokens", 0)),
                           -order, (verdict["trace_id"], anomaly["type"], spent.get("total_tokens", 0),
                                    spent.get("usd"))))
        for tool, anomalies in on_tool.items():
            t = tools.setdefault(tool, [0, 0, 0, 0.0])
            t[0] += 1
            t[1] += len(anomalies)
            t[2] += sum((a["cost"] or {}).get("total_tokens", 0) for a in anomalies)
            t[3] += sum((a["cost"] or {}).get("usd") or 0.0 for a in anomalies)
    looping = [v for v in verdicts if v["anomalies"]]
    ranked.sort(key=lambda item: item[:2], reverse=True)
    return {"runs": len(verdicts), "looped": len(looping),
            "anomalies": sum(len(v["anomalies"]) for v in verdicts),
            "loop_tokens": sum((v["loop_cost"] or {}).get("total_tokens", 0) for v in looping),
            "loop_usd": round(sum((v["loop_cost"] or {}).get("usd") or 0.0 for v in looping), 6),
            "unresolved": sum(1 for v in verdicts if v["unresolved_errors"]),
            "statuses": dict(Counter(v["status"] or NOT_RECORDED for v in verdicts)),
            "agents": {name: [int(r[0]), int(r[1]), int(r[2]), int(r[3]), round(r[4], 6)]
                       for name, r in agents.items()},
            "tools": {name: [int(t[0]), int(t[1]), int(t[2]), round(t[3], 6)] for name, t in tools.items()},
            "top_loops": [item[2] for item in ranked[:20]]}


def looping_tools_only(page: dict[str, Any]) -> dict[str, Any]:
    """The page's per-tool rows of the tools some run looped on (`detect` lists no tool that never looped)."""
    return {name: row for name, row in page["tools"].items() if row[0]}
