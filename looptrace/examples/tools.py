"""Tools to try `looptrace run` with: an office-equipment shelf you can search and reserve from.

    looptrace run "Reserve a projector for 2026-10-08" --tools looptrace/examples/tools.py --model scripted:equipment

Every ``@tool`` function of a file is offered to the model. ``reserve_equipment`` needs a person's approval (it books
something): at a terminal `looptrace run` asks, elsewhere the run pauses (exit code 40) and `looptrace resume` finishes
it. The shelf is the same in every process, so a run paused in one can be resumed in another.
"""

from __future__ import annotations

from typing import Any, Literal

from looptrace import tool

SHELF: dict[str, dict[str, Any]] = {
    "EQ-001": {"name": "Projector A", "stock": 0},
    "EQ-002": {"name": "Projector B", "stock": 2},
    "EQ-010": {"name": "Whiteboard", "stock": 5},
}


@tool
def search_equipment(keyword: str) -> list[dict[str, Any]]:
    """Search office equipment by part of its name. Returns id, name and stock; does not reserve anything.

    Args:
        keyword: Part of the equipment's name, e.g. "projector".
    """
    keyword = keyword.lower()
    return [{"item_id": item_id, **info} for item_id, info in SHELF.items() if keyword in info["name"].lower()]


@tool(needs_approval=True)
def reserve_equipment(item_id: str, date: str, unit: Literal["half_day", "full_day"] = "full_day") -> dict[str, Any]:
    """Reserve one item for a date (YYYY-MM-DD). Fails when its stock is zero.

    Args:
        item_id: An id from search_equipment's results.
        date: The day of use, YYYY-MM-DD.
        unit: Half a day or the full day.
    """
    if item_id not in SHELF:
        raise KeyError(f"no equipment with id {item_id}")
    if SHELF[item_id]["stock"] == 0:
        raise RuntimeError(f"{item_id} has no stock left; try another item id")
    SHELF[item_id]["stock"] -= 1
    return {"reserved": item_id, "date": date, "unit": unit}
