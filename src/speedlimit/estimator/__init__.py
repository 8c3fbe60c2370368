"""The estimate leg: an analytical roofline model of LLM inference.

`core` holds the pure numpy math; `api.estimate` resolves user input and returns an `Estimate`;
`sweep` evaluates grids of configurations at once.
"""

from speedlimit.estimator.api import Estimate, estimate

__all__ = ["Estimate", "estimate"]
