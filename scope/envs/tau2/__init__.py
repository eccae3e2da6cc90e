"""tau2-bench retail and airline domains (tools, user simulator prompt, evaluator), written for scope."""
