"""The tools of the tau2-bench retail and airline domains (:mod:`.retail`, :mod:`.airline`), and running one
call: arguments checked against the tool's schema, a refused write rolled back.

Names, arguments, database effects and error conditions follow tau2-bench. A tool raises
``ToolError`` with a message for any refused call; the environment shows that message to the agent.
Each tool is declared with a JSON schema (shown to the agent) and a kind: read, write or generic.
"""
from __future__ import annotations

import copy
from typing import Any

from .airline import AIRLINE_TOOLS
from .db import OverlayDB
from .retail import RETAIL_TOOLS
from .tooling import ToolError, check_value

DOMAINS = {"retail": {t.name: t for t in RETAIL_TOOLS}, "airline": {t.name: t for t in AIRLINE_TOOLS}}


def call_tool(domain: str, db: OverlayDB, name: str, arguments: Any) -> Any:
    """Run one tool call; raise ToolError with a message for anything the tool refuses.

    The arguments are checked against the tool's schema first; a write that fails part-way is rolled
    back, so a refused call never changes the database."""
    tools = DOMAINS[domain]
    if name not in tools:
        raise ToolError(f"Tool '{name}' not found.")
    t = tools[name]
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    missing = [p for p in t.required if p not in arguments]
    extra = [p for p in arguments if p not in t.params]
    if missing or extra:
        raise ToolError(f"{name}: missing arguments {missing}" if missing else f"{name}: unknown arguments {extra}")
    args = {k: check_value(v, t.params[k], f"{name}: {k}") for k, v in arguments.items()}
    saved = copy.deepcopy(db.over) if t.kind == "write" else None
    try:
        return t.fn(db, **args)
    except Exception as e:  # noqa: BLE001 - every refusal becomes the agent's error message, as in tau2
        if saved is not None:
            db.over = saved
        raise ToolError(str(e) if isinstance(e, ToolError) else f"{type(e).__name__}: {e}") from None
