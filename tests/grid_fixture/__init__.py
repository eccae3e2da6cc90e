"""A tiny experiment for the grid's tests: three arms (the policy as built, one frozen partner, a rotation of
two) of the P4G environment on builtin personas and the tiny random model, a two-step run each, and a section
hook. Its configs are this directory; tests copy them and point ``eval.panel`` at the copy."""
