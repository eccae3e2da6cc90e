"""scope: multi-turn RL for LLM agents against other LLMs, without overfitting to one simulator."""
__version__ = "0.1.0"
