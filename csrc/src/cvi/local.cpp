// The local variational bounds f_b(y, m, v) of cvi.hpp (seed 004, section 4 and Table 1).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "pygpfast/cvi/cvi.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/threads.hpp"

namespace pygpfast::cvi {
namespace {

// A loop over points is split across threads only when each thread gets this many (one
// piecewise expectation costs R - 1 vectorised breakpoint evaluations).
constexpr index_t kMinPointsPerThread = 256;

const char* name_of(LocalBoundType t) {
  switch (t) {
    case LocalBoundType::BernoulliLogit:
      return "Bernoulli-logit";
    case LocalBoundType::Poisson:
      return "Poisson";
    case LocalBoundType::Multinomial:
      return "multinomial";
    case LocalBoundType::StickBreaking:
      return "stick-breaking";
    case LocalBoundType::Ordinal:
      return "ordinal";
  }
  return "unknown";
}

bool uses_llp(LocalBoundType t) {
  return t == LocalBoundType::BernoulliLogit || t == LocalBoundType::StickBreaking ||
         t == LocalBoundType::Ordinal;
}

// E[B(x)] at x ~ N(mean, v) for the three llp-based kinds.
piecewise::Expectation llp(const LocalBound& lb, double mean, double v) {
  return piecewise::expected_bound_at(lb.llp, mean, v);
}

// Per-point outputs of one evaluation; dphi holds the (at most two) threshold derivatives of an
// ordinal point, at thresholds phi_index[0] and phi_index[1] (-1: none).
struct PointOutput {
  double value = 0.0;
  double dphi[2] = {0.0, 0.0};
  int phi_index[2] = {-1, -1};
};

// f_b of one point (latents at m[l * stride], v[l * stride]) and its derivatives per latent.
// Poisson omits lgamma(y + 1) (added serially by the caller: glibc's lgamma is not thread safe).
PointOutput point_bound(const LocalBound& lb, double y, const double* m, const double* v,
                        index_t stride, double* dm, double* dv, double* d2m) {
  PointOutput out;
  switch (lb.type) {
    case LocalBoundType::BernoulliLogit: {
      const auto e = llp(lb, m[0], v[0]);
      out.value = y * m[0] - e.value;
      dm[0] = y - e.dm;
      dv[0] = -e.dv;
      d2m[0] = 2.0 * dv[0];  // a Gaussian expectation: d^2/dm^2 = 2 d/dv
      break;
    }
    case LocalBoundType::Poisson: {
      const double rate = std::exp(m[0] + 0.5 * v[0]);
      out.value = y * m[0] - rate;
      dm[0] = y - rate;
      dv[0] = -0.5 * rate;
      d2m[0] = -rate;
      break;
    }
    case LocalBoundType::Multinomial: {
      const index_t C = lb.num_classes;
      double top = -std::numeric_limits<double>::infinity();
      for (index_t l = 0; l < C; ++l) top = std::max(top, m[l * stride] + 0.5 * v[l * stride]);
      double sum = 0.0;
      for (index_t l = 0; l < C; ++l) sum += std::exp(m[l * stride] + 0.5 * v[l * stride] - top);
      const double lse = top + std::log(sum);
      const auto k = static_cast<index_t>(y);
      out.value = m[k * stride] - lse;
      for (index_t l = 0; l < C; ++l) {
        const double p = std::exp(m[l * stride] + 0.5 * v[l * stride] - lse);
        dm[l * stride] = (l == k ? 1.0 : 0.0) - p;
        dv[l * stride] = -0.5 * p;
        d2m[l * stride] = -p * (1.0 - p);
      }
      break;
    }
    case LocalBoundType::StickBreaking: {
      const auto k = static_cast<index_t>(y);
      for (index_t j = 0; j + 1 < lb.num_classes; ++j) {
        double value = 0.0, gm = 0.0, gv = 0.0;
        if (j <= k) {  // log sigmoid(z_k) = z_k - llp(z_k); log sigmoid(-z_j) = -llp(z_j)
          const auto e = llp(lb, m[j * stride], v[j * stride]);
          const double hit = j == k ? 1.0 : 0.0;
          value = hit * m[j * stride] - e.value;
          gm = hit - e.dm;
          gv = -e.dv;
        }
        out.value += value;
        dm[j * stride] = gm;
        dv[j * stride] = gv;
        d2m[j * stride] = 2.0 * gv;
      }
      break;
    }
    case LocalBoundType::Ordinal: {
      const auto k = static_cast<index_t>(y);
      const index_t last = lb.num_classes - 1;
      const std::vector<double>& phi = lb.thresholds;
      if (k == 0) {  // log sigmoid(phi_0 - z) = -llp(z - phi_0)
        const auto e = llp(lb, m[0] - phi[0], v[0]);
        out.value = -e.value;
        dm[0] = -e.dm;
        dv[0] = -e.dv;
        out.phi_index[0] = 0;
        out.dphi[0] = e.dm;
      } else if (k == last) {  // log sigmoid(z - phi_{K-2}) = -llp(phi_{K-2} - z)
        const auto e = llp(lb, phi[k - 1] - m[0], v[0]);
        out.value = -e.value;
        dm[0] = e.dm;
        dv[0] = -e.dv;
        out.phi_index[0] = static_cast<int>(k - 1);
        out.dphi[0] = -e.dm;
      } else {
        const double up = phi[k], lo = phi[k - 1], gap = up - lo;
        const auto eu = llp(lb, up - m[0], v[0]);
        const auto el = llp(lb, lo - m[0], v[0]);
        const double tail = 1.0 / std::expm1(gap);  // d/d up of log(1 - e^-gap)
        out.value = (up - m[0]) - eu.value - el.value + std::log(-std::expm1(-gap));
        dm[0] = -1.0 + eu.dm + el.dm;
        dv[0] = -eu.dv - el.dv;
        out.phi_index[0] = static_cast<int>(k);
        out.dphi[0] = 1.0 - eu.dm + tail;
        out.phi_index[1] = static_cast<int>(k - 1);
        out.dphi[1] = -el.dm - tail;
      }
      d2m[0] = 2.0 * dv[0];
      break;
    }
  }
  return out;
}

}  // namespace

index_t LocalBound::num_latent() const {
  switch (type) {
    case LocalBoundType::Multinomial:
      return num_classes;
    case LocalBoundType::StickBreaking:
      return num_classes - 1;
    default:
      return 1;
  }
}

void validate(const LocalBound& lb) {
  const int code = static_cast<int>(lb.type);
  require(code >= 0 && code <= static_cast<int>(LocalBoundType::Ordinal),
          "cvi: unknown local bound type ", code,
          " (0 Bernoulli-logit, 1 Poisson, 2 multinomial, 3 stick-breaking, 4 ordinal)");
  if (uses_llp(lb.type)) piecewise::validate(lb.llp);
  switch (lb.type) {
    case LocalBoundType::BernoulliLogit:
    case LocalBoundType::Poisson:
      require(lb.thresholds.empty(), "cvi: the ", name_of(lb.type), " likelihood takes no thresholds");
      break;
    case LocalBoundType::Multinomial:
    case LocalBoundType::StickBreaking:
      require(lb.num_classes >= 2, "cvi: the ", name_of(lb.type), " likelihood needs num_classes >= 2, got ",
              lb.num_classes);
      require(lb.thresholds.empty(), "cvi: the ", name_of(lb.type), " likelihood takes no thresholds");
      break;
    case LocalBoundType::Ordinal: {
      require(lb.num_classes >= 2,
              "cvi: the ordinal likelihood needs num_classes >= 2, got ", lb.num_classes);
      require(lb.num_thresholds() == lb.num_classes - 1,
              "cvi: the ordinal likelihood with ", lb.num_classes, " classes needs ", lb.num_classes - 1,
              " thresholds, got ", lb.num_thresholds());
      for (index_t k = 0; k < lb.num_thresholds(); ++k) {
        require(std::isfinite(lb.thresholds[k]),
                "cvi: thresholds[", k, "] is not finite");
        require(k == 0 || lb.thresholds[k] > lb.thresholds[k - 1],
                "cvi: ordinal thresholds must be strictly increasing, but thresholds[", k, "] = ",
                lb.thresholds[k], " follows ", lb.thresholds[k - 1]);
      }
      break;
    }
  }
}

void check_labels(const LocalBound& lb, const double* y, index_t n) {
  for (index_t i = 0; i < n; ++i) {
    const double yi = y[i];
    bool ok;
    std::string support;
    switch (lb.type) {
      case LocalBoundType::BernoulliLogit:
        ok = yi == 0.0 || yi == 1.0;
        if (!ok) support = "0 or 1";
        break;
      case LocalBoundType::Poisson:
        ok = yi >= 0.0 && std::isfinite(yi);
        if (!ok) support = "finite and >= 0";
        break;
      default:
        ok = yi >= 0.0 && yi <= lb.num_classes - 1 && yi == std::floor(yi);
        if (!ok) support = "class indices 0.." + std::to_string(lb.num_classes - 1);
        break;
    }
    if (!ok)  // (the message is built only on failure: this loop runs over every point)
      throw std::invalid_argument("y[" + std::to_string(i) + "] = " + format_value(yi) +
                                  " is outside the support of the " + name_of(lb.type) +
                                  " likelihood: labels must be " + support);
  }
}

void local_bounds(const LocalBound& lb, const double* y, index_t N, const double* m,
                  const double* v, double* value, double* dm, double* dv, double* d2m,
                  double* dthresholds) {
  const index_t L = lb.num_latent();
  const bool ordinal = lb.type == LocalBoundType::Ordinal;
  std::vector<double> dphi;
  std::vector<int> phi_index;
  if (ordinal && dthresholds != nullptr) {
    dphi.assign(static_cast<std::size_t>(2 * N), 0.0);
    phi_index.assign(static_cast<std::size_t>(2 * N), -1);
  }
  // Scratch for the derivatives the caller did not ask for.
  std::vector<double> scratch;
  if (dm == nullptr || dv == nullptr || d2m == nullptr)
    scratch.resize(static_cast<std::size_t>(3 * L * N));
  double* gm = dm != nullptr ? dm : scratch.data();
  double* gv = dv != nullptr ? dv : scratch.data() + L * N;
  double* gmm = d2m != nullptr ? d2m : scratch.data() + 2 * L * N;
  parallel_for(N, kMinPointsPerThread, [&](index_t n) {
    const PointOutput out = point_bound(lb, y[n], m + n, v + n, N, gm + n, gv + n, gmm + n);
    value[n] = out.value;
    if (!dphi.empty())
      for (int s = 0; s < 2; ++s) {
        dphi[2 * n + s] = out.dphi[s];
        phi_index[2 * n + s] = out.phi_index[s];
      }
  });
  if (lb.type == LocalBoundType::Poisson)
    for (index_t n = 0; n < N; ++n) value[n] -= std::lgamma(y[n] + 1.0);
  if (ordinal && dthresholds != nullptr) {
    std::fill(dthresholds, dthresholds + lb.num_thresholds(), 0.0);
    for (index_t i = 0; i < 2 * N; ++i)
      if (phi_index[i] >= 0) dthresholds[phi_index[i]] += dphi[i];
  }
}

SiteBound site_bound(const LocalBound& lb, double y, const double* m, const double* v,
                     index_t stride, index_t l, double v_l) {
  switch (lb.type) {
    case LocalBoundType::StickBreaking: {
      // Separable: latent l has a term only when l <= y (the others' terms are left out).
      const auto k = static_cast<index_t>(y);
      if (l > k) return {0.0, 0.0};
      const auto e = llp(lb, m[l * stride], v_l);
      return {(l == k ? m[l * stride] : 0.0) - e.value, 2.0 * e.dv};
    }
    case LocalBoundType::Multinomial: {
      const index_t C = lb.num_classes;
      auto arg = [&](index_t j) { return m[j * stride] + 0.5 * (j == l ? v_l : v[j * stride]); };
      double top = -std::numeric_limits<double>::infinity();
      for (index_t j = 0; j < C; ++j) top = std::max(top, arg(j));
      double sum = 0.0;
      for (index_t j = 0; j < C; ++j) sum += std::exp(arg(j) - top);
      const double lse = top + std::log(sum);
      return {m[static_cast<index_t>(y) * stride] - lse, std::exp(arg(l) - lse)};
    }
    default: {  // one latent function
      double gm, gv, gmm;
      const PointOutput out = point_bound(lb, y, m, &v_l, 1, &gm, &gv, &gmm);
      return {out.value, -2.0 * gv};
    }
  }
}

}  // namespace pygpfast::cvi
