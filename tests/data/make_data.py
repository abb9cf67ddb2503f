"""Write the small data files in tests/data from the project's shared folder, so that the tests
that need them run in a checkout without it.

    python tests/data/make_data.py [SHARED]      (SHARED: default ../shared beside the repository)

uci_glass.npz
    X [214, 9] and y [214] (class index 0..5) of shared/data/uci_glass.npz (UCI Glass
    Identification, CC BY 4.0): tests/test_cvi.py's multi-class benchmark.
llp_bound_R20.csv, llp_bound_errors.csv
    shared/reference/llp_bound_R20.csv as it is (the published R = 20 piecewise-quadratic bound
    of Marlin, Khan & Murphy 2011, MIT licence), and the columns R, lin_max_gap, quad_max_gap of
    shared/reference/llp_bound_errors.csv: tests/test_piecewise.py's check of its literals.
"""

import csv
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ERROR_COLUMNS = ("R", "lin_max_gap", "quad_max_gap")


def main(shared):
    glass = np.load(shared / "data" / "uci_glass.npz")
    np.savez_compressed(HERE / "uci_glass.npz", X=glass["X"], y=glass["y"])
    shutil.copyfile(shared / "reference" / "llp_bound_R20.csv", HERE / "llp_bound_R20.csv")
    with open(shared / "reference" / "llp_bound_errors.csv") as f:
        lines = f.readlines()
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    with open(HERE / "llp_bound_errors.csv", "w", newline="") as f:
        f.write("# The columns R, lin_max_gap, quad_max_gap of shared/reference/llp_bound_errors.csv "
                "(tests/data/make_data.py): max_gap = max_x f(x) - llp(x) of the minimax linear "
                "and quadratic R-piece bounds, exact, from per-piece critical points.\n")
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(ERROR_COLUMNS)
        writer.writerows([row[k] for k in ERROR_COLUMNS] for row in rows)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "shared")
