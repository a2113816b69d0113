"""Data generators (synthetic only: no files, no environment) and stacked fixtures."""

from tasks.data.stacks import synthetic_stack
from tasks.data.synthetic import (DISTRIBUTIONS, STREAMS, binary_subset, gauss, gauss_scaled, labels, orthogonal,
                                  seed_streams, sphere, synthetic)

__all__ = ["DISTRIBUTIONS", "STREAMS", "binary_subset", "gauss", "gauss_scaled", "labels", "orthogonal",
           "seed_streams", "sphere", "synthetic", "synthetic_stack"]
