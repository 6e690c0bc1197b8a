"""sera_jax: Scale-Equalized Rollout Allocation (SERA) for Maximum Likelihood RL, in JAX.

The public API is the pure math of ``sera_jax.core``; models, environments, the RL trainer and the
experiments live in the subpackages.
"""

from sera_jax.core import *  # noqa: F401,F403
from sera_jax.core import __all__  # noqa: F401

__version__ = "0.1.0"
