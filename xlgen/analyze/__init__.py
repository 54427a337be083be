"""`xlgen analyze <what> ...`: analysis tools for trained workdirs (and `plot`: `xlgen plot`, the training curves).

    xlgen analyze rank     --workdir=DIR [--json=FILE --png=FILE ...]   rank of the log-probability matrix Q
    xlgen analyze spectrum --workdir=DIR [--workdir=DIR2 ...] [--json=FILE --png=FILE]
                                                                       output-embedding singular values, isotropy
    xlgen analyze recl     --workdir=DIR [--workdir=DIR2 ...] [--r=0.1,0.5,1.0 --delta=100 --json=FILE]
                                                                       relative effective context length (TXL)
    xlgen analyze kld      --workdir=DIR [--contexts=N --json=FILE --png=FILE]
                                                                       expected pairwise KLD between contexts
    xlgen analyze robustness (--workdir=DIR | --npy=Q.npy) [--keep=10 --noise=... --json --png]
                                                                       Press-rank robustness (001 Alg. 5.1/5.2)
    xlgen analyze compare  --group=NAME=DIR,DIR,... [--values=NAME=X,X] [--metric=loss --json --png]
                                                                       mean ± std over seeds, Wilcoxon rank-sum
    xlgen analyze textgen  --generated=FILE --reference=FILE [--encoder=lsa --json=FILE]
                                                                       BLEU / Self-BLEU / Inverse BLEU, FED, LCR

Each tool is a module with `main(argv) -> int`, registered in `TOOLS` below (add one line per new tool).
"""

from __future__ import annotations

import importlib
import sys
from typing import List, Optional

TOOLS = {
    "rank": "xlgen.analyze.rank",
    "spectrum": "xlgen.analyze.spectrum",
    "recl": "xlgen.analyze.recl",
    "kld": "xlgen.analyze.kld",
    "robustness": "xlgen.analyze.robustness",
    "compare": "xlgen.analyze.compare",
    "textgen": "xlgen.analyze.textgen",
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\ntools: " + ", ".join(sorted(TOOLS)))
        return 0 if argv else 2
    tool, rest = argv[0], argv[1:]
    if tool not in TOOLS:
        print(f"xlgen analyze: unknown tool {tool!r}; expected one of {sorted(TOOLS)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(TOOLS[tool]).main(rest) or 0)
