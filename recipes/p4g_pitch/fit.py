"""What P4G-pitch's persuadees P1-P4 (and G1-G4) are fitted to (``scope sim fit --examples
recipes.p4g_pitch.fit:fit_views``): each real dialogue as the persuadee saw it under this environment's short
persona, and one forced decision per dialogue: the persona, the dialogue's pitch and the decision note, answered
with ``[DONATE $N]`` of that participant's actual donation."""
from __future__ import annotations

import re

from scope.data.p4g import HumanDialogue

from .env import DECISION_NOTE, PARTNER_PROMPT, short_persona

_PITCH = re.compile(r"save the children|charit|donat|child", re.IGNORECASE)


def pitch_of(d: HumanDialogue, max_words: int = 48) -> str | None:
    """The persuader's pitch in a dialogue: its first turn that names the charity, donating or children (else its
    first turn), cut to ``max_words`` words; None if the persuader never spoke."""
    said = [t for r, t in d.turns if r == "persuader"]
    if not said:
        return None
    text = next((t for t in said if _PITCH.search(t)), said[0])
    return " ".join(text.split()[:max_words])


def dollars(x: float) -> str:
    """An amount as a person writes it: 2, 0.5, 0.25."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def system_prompt(d: HumanDialogue) -> str:
    return PARTNER_PROMPT.format(persona=short_persona(d.persona))


def decision_view(d: HumanDialogue) -> list[dict[str, str]] | None:
    """The forced decision: the persona, the dialogue's pitch followed by the decision note, and the reply
    ``[DONATE $N]`` with this participant's actual donation (None when the donation or the pitch is unknown)."""
    pitch = pitch_of(d)
    if d.donation is None or pitch is None:
        return None
    return [{"role": "system", "content": system_prompt(d)},
            {"role": "user", "content": pitch + "\n\n" + DECISION_NOTE},
            {"role": "assistant", "content": f"[DONATE ${dollars(d.donation)}]"}]


def fit_views(d: HumanDialogue) -> list[list[dict[str, str]]]:
    """The dialogue under the short persona, then its forced decision (where it has one)."""
    decision = decision_view(d)
    return [d.partner_view(system_prompt(d))] + ([decision] if decision is not None else [])
