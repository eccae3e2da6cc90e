"""Write the EnvSim benchmark's definition (scope/envsim/data/bench.json): which 400 samples, drawn (seeded,
stratified by changed fields) from the tau2 data. Only ids, the seed and the tau2 files' blob ids are
written; `scope envsim bench` rebuilds the samples from the user's own tau2 data.

    python tools/make_envsim_bench.py [--data DIR] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
from collections import Counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("SCOPE_TAU2_DATA", "../shared/data/tau2"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from scope.envsim.bench import MANIFEST, load_bench, make_manifest
    from scope.envsim.samples import stratum

    m = make_manifest(a.data, a.seed)
    with open(MANIFEST, "w") as f:
        json.dump(m, f, indent=1)
    samples = load_bench(a.data)
    print(f"wrote {MANIFEST}: {len(m['ids'])} samples; {dict(Counter(stratum(s) for s in samples))}")


if __name__ == "__main__":
    main()
