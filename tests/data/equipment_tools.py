"""The demo's equipment tools as a tools file, for `looptrace run --tools` in tests."""

from looptrace.cli.demo import Inventory

search_equipment, reserve_equipment = Inventory().tools()
