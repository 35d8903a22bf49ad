"""The offline demos: real tools, a scripted model, no key and no network.

- equipment: the reservation story from the tool-use article. The model searches, tries to reserve a projector that
  has no stock, reads the error, reserves the other one and ends its turn: four turns, three tool calls, one failing
  and handed back to the model as an is_error result.
- runaway: a model that keeps calling the same tool; the detector nudges it, then stops the run.
- ignored-error: a failing tool, then a final answer that claims success; the detector flags it.
"""

from __future__ import annotations

from typing import Any, Literal

from looptrace.runtime import tool

DEMO_MODEL = "claude-sonnet-5-5"
DEMO_TASK = "Reserve a projector for 2026-10-08."
DEMO_SYSTEM = "You book office equipment. Check stock with search_equipment before reserving."


class Inventory:
    """A tiny in-memory stock so each demo run starts from the same shelf."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {
            "EQ-001": {"name": "Projector A", "stock": 0},
            "EQ-002": {"name": "Projector B", "stock": 2},
            "EQ-010": {"name": "Whiteboard", "stock": 5},
        }

    def tools(self) -> list[Any]:
        items = self.items

        @tool
        def search_equipment(keyword: str) -> list[dict[str, Any]]:
            """Search office equipment by part of its name. Returns id, name and stock; does not reserve anything.

            Args:
                keyword: Part of the equipment's name, e.g. "projector".
            """
            keyword = keyword.lower()
            return [{"item_id": item_id, **info} for item_id, info in items.items() if keyword in info["name"].lower()]

        @tool
        def reserve_equipment(item_id: str, date: str,
                              unit: Literal["half_day", "full_day"] = "full_day") -> dict[str, Any]:
            """Reserve one item for a date (YYYY-MM-DD). Fails when its stock is zero.

            Args:
                item_id: An id from search_equipment's results.
                date: The day of use, YYYY-MM-DD.
                unit: Half a day or the full day.
            """
            if item_id not in items:
                raise KeyError(f"no equipment with id {item_id}")
            if items[item_id]["stock"] == 0:
                raise RuntimeError(f"{item_id} has no stock left; try another item id")
            items[item_id]["stock"] -= 1
            return {"reserved": item_id, "date": date, "unit": unit}

        return [search_equipment, reserve_equipment]


def _tool_use(call_id: str, name: str, arguments: dict[str, Any], usage: tuple[int, int]) -> dict[str, Any]:
    return {
        "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}],
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def equipment_script() -> list[dict[str, Any]]:
    """The four responses of the story, in the Messages API shape."""
    return [
        _tool_use("toolu_01", "search_equipment", {"keyword": "projector"}, (412, 38)),
        _tool_use("toolu_02", "reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"}, (534, 52)),
        _tool_use("toolu_03", "reserve_equipment", {"item_id": "EQ-002", "date": "2026-10-08"}, (611, 55)),
        {
            "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "Projector A (EQ-001) is out of stock, so I reserved Projector B "
                                                 "(EQ-002) for 2026-10-08, full day."}],
            "usage": {"input_tokens": 702, "output_tokens": 41},
        },
    ]


def runaway_script() -> list[dict[str, Any]]:
    """A model that never changes course: the same search, turn after turn, whatever it is told."""
    return [_tool_use(f"toolu_{n:02d}", "search_equipment", {"keyword": "projector"}, (400 + 60 * n, 30))
            for n in range(1, 11)]


def ignored_error_script() -> list[dict[str, Any]]:
    """A reservation that fails twice, a look elsewhere, and a final answer that claims it worked."""
    return [
        _tool_use("toolu_01", "reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"}, (420, 48)),
        _tool_use("toolu_02", "reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"}, (480, 48)),
        _tool_use("toolu_03", "search_equipment", {"keyword": "projector"}, (540, 30)),
        {
            "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "Done! Your projector is booked for the whole day."}],
            "usage": {"input_tokens": 610, "output_tokens": 22},
        },
    ]


STORIES = {
    "equipment": ("Reserve a projector for 2026-10-08.", equipment_script,
                  "a scripted model replays four responses; the tools are real"),
    "runaway": ("Find me a projector.", runaway_script,
                "a scripted model that repeats the same search forever: nudged, then stopped"),
    "ignored-error": ("Reserve Projector A for 2026-10-08.", ignored_error_script,
                      "a reservation fails and the model claims success anyway"),
}
