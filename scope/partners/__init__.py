"""Where each role's replies come from: sources of bindings (single, rotation, persona) and decoding."""
from .sources import Binding, PersonaSource, RotationSource, SingleSource, build_sources

__all__ = ["Binding", "SingleSource", "RotationSource", "PersonaSource", "build_sources"]
