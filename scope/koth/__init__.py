"""King of the Hill: a 2v2 grid game, RL skills, a behaviour tree, and an LLM controller as a scope role."""
