"""What every estimator shares (private)."""
