"""The default hyperparameter priors of every estimator (``priors="default"``): fits at the MAP
point rather than at the maximum of the marginal likelihood's bound.

Lengthscales. Hvarfner, Hellsten & Nardi (2024, "Vanilla Bayesian optimization performs great
in high dimensions"; BoTorch's default since 2024) put log l ~ N(sqrt(2) + log(D) / 2, 3) on
each lengthscale of inputs scaled to the unit cube, as a density on l. As a density on
theta = log l (pygpfast's convention, :mod:`pygpfast.priors`) the same MAP objective is
N(theta | sqrt(2) + log(D) / 2 - 3, 3): its mode, 0.205 sqrt(D), is the mode of theirs.
pygpfast does not rescale the inputs, so the unit cube's width is read from the data: two
points drawn uniformly from [0, 1] lie a median 1 - 1/sqrt(2) = 0.293 apart, so an input
dimension whose median distance between rows (those that differ there) is m_d counts as a cube
of width m_d / 0.293.
The prior on lengthscale d is then LogNormal(log(m_d sqrt(D)) + LENGTHSCALE_OFFSET, sqrt(3))
with LENGTHSCALE_OFFSET = sqrt(2) - 3 - log(1 - 1/sqrt(2)) = -0.358: centred at 0.70 times the
median-distance lengthscale m_d sqrt(D) from which the default kernel starts
(:func:`pygpfast._base._start.default_kernel`), and equal to BoTorch's prior on data spread
uniformly over a box. Standardised Gaussian features (m_d = 0.954) get their mode at
0.67 sqrt(D). An isotropic lengthscale gets the geometric mean of the per-dimension centres.

Variances. The kernel variance of each stationary leaf: LogNormal(log(scale), sqrt(3)) with
``scale`` the estimator's latent scale (``_target_scale()``; 1 for classifiers and
standardised targets), a 95% interval of [0.034, 30] times the scale; in a product the
variances multiply, so the first stationary factor takes it and the others are centred at 1.
A Gaussian likelihood's noise variance: LogNormal(log(scale / 10), sqrt(3)), noise between
0.3% and 300% of the scale (95%). Linear, Constant and White leaves get no default prior.

Label noise, where it is learned (``label_noise="learn"``: a Bernoulli likelihood's epsilon or
robust-max's): LogNormal(log(0.01), sqrt(3)) on log epsilon, 95% between 3.4e-4 and 0.30; its
mode 0.01 lies between GPflow's fixed 1e-3 and the 1e-2 of Kim & Ghahramani's (2008)
experiments. On clean labels it keeps epsilon from drifting to 0 (where the likelihood's
gradient in log epsilon vanishes, the objective flat).

A hyperparameter whose prior the user set (``kernel.priors``, None for flat included) keeps it.
"""

import numpy as np

from ..priors import LogNormal
from ._start import reference_lengthscale, stationary_leaves

#: Standard deviation of log l (Hvarfner, Hellsten & Nardi 2024).
LENGTHSCALE_SCALE = float(np.sqrt(3.0))
#: Median |u - u'| of u, u' uniform on [0, 1].
UNIT_CUBE_MEDIAN = 1.0 - 1.0 / np.sqrt(2.0)
#: The prior's centre relative to log of the median-distance lengthscale m_d sqrt(D).
LENGTHSCALE_OFFSET = float(np.sqrt(2.0) - 3.0 - np.log(UNIT_CUBE_MEDIAN))
#: Standard deviation of log variance (kernel variance and noise variance).
VARIANCE_SCALE = float(np.sqrt(3.0))
#: The noise variance's centre relative to the latent scale.
NOISE_FRACTION = 0.1
#: The label-noise probability's centre.
LABEL_NOISE_CENTRE = 0.01


def attach_default_priors(kernel, X, scale=1.0):
    """Set, in place, the default priors (module docstring) on the hyperparameters of `kernel`'s
    leaves that have none set; `X` [N, D] gives the lengthscales' reference and `scale` the
    latent scale. Returns `kernel`."""
    reference = None
    D = X.shape[1]

    def lengthscale_prior(value):
        nonlocal reference
        if reference is None:
            reference = np.log(reference_lengthscale(X))
        if np.ndim(value) and len(value) == D:
            loc = reference + LENGTHSCALE_OFFSET
        else:  # (isotropic; or a length the kernel will refuse anyway)
            loc = float(np.mean(reference)) + LENGTHSCALE_OFFSET
        return LogNormal(loc, LENGTHSCALE_SCALE)

    for leaf, carries_variance in stationary_leaves(kernel):
        priors = dict(leaf.priors)
        if "lengthscale" not in priors:
            priors["lengthscale"] = lengthscale_prior(leaf.lengthscale)
        if "variance" not in priors:
            priors["variance"] = LogNormal(float(np.log(scale)) if carries_variance else 0.0,
                                           VARIANCE_SCALE)
        leaf.priors = priors
    return kernel


def attach_default_noise_prior(likelihood, scale=1.0):
    """Set, in place, the default prior on a likelihood's learned parameter unless one is set:
    a Gaussian's noise variance, a learned label-noise probability; likelihoods without
    parameters are left as they are. Returns `likelihood`."""
    defaults = {"variance": lambda: default_noise_prior(scale),
                "label_noise": default_label_noise_prior, "epsilon": default_label_noise_prior}
    missing = {name: defaults[name]() for name in likelihood.param_names
               if name in defaults and name not in likelihood.priors}
    if missing:
        likelihood.priors = {**likelihood.priors, **missing}
    return likelihood


def default_label_noise_prior():
    """The default prior on a learned label-noise probability (a density on its log)."""
    return LogNormal(float(np.log(LABEL_NOISE_CENTRE)), VARIANCE_SCALE)


def default_noise_prior(scale=1.0):
    """The default prior on a Gaussian noise variance for latent scale `scale`."""
    return LogNormal(float(np.log(NOISE_FRACTION * scale)), VARIANCE_SCALE)
