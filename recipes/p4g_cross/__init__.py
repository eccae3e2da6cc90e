"""P4G-pitch across families (README.md, pre-registered): P4G-pitch's task with persuadees of two model families,
SmolLM2 (P1-P4) and Gemma 3 270M base (G1-G4). Its configs bring P4G-pitch's environment in
(``run.plugins: [recipes.p4g_pitch]``); this package holds its own commands (``python -m recipes.p4g_cross``):
the Gemma fits, the pilot, the fidelity cards, the re-scoring of P4G-pitch's records and the verdicts."""
