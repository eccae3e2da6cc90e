"""tau2-bench retail and airline domains (tools, user simulator prompt, evaluator), written for scope."""
from .env import Tau2Airline, Tau2Env, Tau2Retail, evaluate, load_domain, parse_tool_call, replay

__all__ = ["Tau2Env", "Tau2Retail", "Tau2Airline", "evaluate", "load_domain", "parse_tool_call", "replay"]
