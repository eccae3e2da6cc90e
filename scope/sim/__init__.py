"""Simulators fitted to people: ``scope sim fit`` (a LoRA adapter trained on real P4G persuadees) and its
measurement against the base simulator (``scope sim measure``)."""
