"""P4G-pitch: one pitch from a LoRA persuader to a real P4G persona, scored by the persuadee's expected decision
(README.md). Importing it registers the ``p4g_pitch`` environment (``run.plugins: [recipes.p4g_pitch]``)."""
from . import env  # noqa: F401  (registers the environment)
