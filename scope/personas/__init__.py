"""Evolved persona generators: a quality-diversity search over structured persona generators whose
fitness comes from the dialogues their personas play (``scope personas evolve``)."""
