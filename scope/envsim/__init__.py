"""Environment simulation: an LLM plays the tools, graded against the exact tau2 tools (``scope envsim``)."""
