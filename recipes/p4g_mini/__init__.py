"""P4G-mini: the paper's Persuasion for Good grid at CPU scale (README.md). Configs only: it runs on the core's
``p4g`` environment and the collapse lab's signatures hook."""
