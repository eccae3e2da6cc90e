"""Data of people that environments and fitted simulators read (Persuasion for Good)."""
