"""Docstring fragments every estimator shares (numpydoc; GLOSSARY.md holds the vocabulary)."""

KERNEL = """    kernel : pygpfast.kernels.Kernel or None, default None
        Prior covariance, shared by the latent functions, and where the hyperparameter search
        starts. None: RBF with ARD lengthscales from the median distance along each input
        dimension between rows that differ there (times sqrt(D)) on a subsample of X.
"""

COMMON = """    optimize_hyperparameters : bool, default True
        Learn the kernel's (and the likelihood's) parameters; False keeps them fixed.
    priors : {'default', None}, default 'default'
        Priors on the hyperparameters: the search maximises the objective plus their log
        density (the MAP point; ``objective_`` is that sum, ``log_prior_`` the prior's share).
        'default': a log-normal on each lengthscale centred near the data's scale and widening
        with D (Hvarfner, Hellsten & Nardi 2024), weak log-normals on the kernel variance and a
        Gaussian noise variance (:mod:`pygpfast._base._priors`); a prior set on the kernel
        (``kernel__priors__lengthscale``) takes precedence. None: the kernel's own priors only
        (none unless set): plain type-II maximum likelihood.
    jitter : float in [0, 1), default 1e-6
        Added to the diagonal of the kernel matrix, relative to its mean diagonal.
    random_state : int, RandomState or None, default None
        Seeds every random choice of the fit (subsamples, k-means, minibatches, the data-scaled
        start of a second search): the same value gives the same fit, bit for bit.
    verbose : int or bool, default 0
        Print the objective every `verbose` iterations (True: every iteration).
    callback : callable or None, default None
        ``callback(estimator, iteration, objective) -> bool`` after every iteration, with the
        estimator's fitted attributes at that iteration (it may predict); True stops the fit.
"""

ATTRIBUTES = """    objective_ : float
        The value the fit maximised (see the estimator's summary), plus ``log_prior_``.
    log_prior_ : float
        The log prior density of the fitted hyperparameters (on their logarithms, see
        :mod:`pygpfast.priors`): the priors' share of ``objective_``; 0.0 without priors.
    history_ : ndarray [n_iter_]
        objective_ after each iteration (of the search kept, see restart_).
    n_iter_ : int
        Iterations of the search kept.
    kernel_ : pygpfast.kernels.Kernel
        The fitted kernel (a copy; the ``kernel`` argument is left as it was).
    restart_ : dict or None
        None, or the second search that ran because the first ended degenerate (see Notes):
        ``"reason"`` (``"isolated"``, ``"unreached"``, ``"constant"`` or ``"stalled"``),
        ``"start"`` (its starting kernel), ``"objectives"`` (what each search reached, the
        first's first), ``"kept"`` (``"given"`` or ``"data-scaled"``, the higher) and
        ``"both_constant"`` (both ended at a constant latent function: labels without signal).
    n_features_in_ : int
"""

NOTES = """
    Notes
    -----
    Lengthscales far from the distances between the training inputs make the kernel matrix
    numerically diagonal (a memoriser) or constant, a variance far below the latent scale makes
    the prior flat, and the objective's gradients vanish there, so the search cannot leave. After
    the fit, ``pygpfast._base._diagnose.diagnose`` looks for these on up to 2000 training rows.
    When it finds one and the search may be repeated, a second search starts from the data's
    scale (the given kernel's structure with the default kernel's lengthscales and variance) and
    the fit keeps whichever reaches the higher objective, with the warnings of that search only
    (``restart_``). With priors, which pull a search off such a start but may let it stall on
    the way, a start that is itself degenerate is searched again the same way. A degeneracy
    that remains is a ``ConvergenceWarning`` naming the cause.
"""
