"""pygpfast's main job in one command: ``python -m pygpfast.demo``.

Fits a sparse variational GP classifier to the UCI Ionosphere radar data shipped with the
package (a fixed 80/20 split) and prints hold-out accuracy and negative log predictive density.
"""

import time

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

import pygpfast
from pygpfast.datasets import load_ionosphere


def main():
    X, y = load_ionosphere()
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(Xtr)
    Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)

    clf = pygpfast.SVGPClassifier(n_inducing=50, random_state=0)
    t0 = time.perf_counter()
    clf.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0

    proba = clf.predict_proba(Xte)
    idx = np.searchsorted(clf.classes_, yte)
    nlpd = -np.mean(clf.predict_log_proba(Xte)[np.arange(len(yte)), idx])
    acc = np.mean(clf.classes_[proba.argmax(1)] == yte)
    print(f"pygpfast {pygpfast.__version__}: SVGP classifier on UCI ionosphere "
          f"({len(ytr)} train / {len(yte)} test, D={X.shape[1]}, M={clf.inducing_points_.shape[0]})")
    print(f"fit time {fit_s:.2f} s ({clf.optimizer_}, {clf.n_iter_} iterations), ELBO {clf.objective_:.2f}")
    print(f"hold-out accuracy {acc:.4f}")
    print(f"hold-out NLPD     {nlpd:.4f}")


if __name__ == "__main__":
    main()
