"""Shared pytest configuration: hypothesis profiles.

``ci`` (the default) keeps property tests short and reproducible on a 2-core machine:
50 examples, no deadline (no timing asserts), derandomized. ``dev`` explores more
(``HYPOTHESIS_PROFILE=dev``).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
