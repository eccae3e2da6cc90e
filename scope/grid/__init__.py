"""``scope grid``: an experiment's arms x seeds, declared in ``grid.yaml`` (:mod:`.spec`), each run an ordinary
training run (:mod:`.runner`), kept as records (:mod:`.records`) and tabulated (:mod:`.aggregate`, :mod:`.table`,
:mod:`.curves`, :mod:`.dialogues`). It names no arm: what an experiment reads into its runs comes from its hooks."""
