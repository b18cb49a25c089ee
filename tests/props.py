"""Settings of the property tests (hypothesis): bounded for CI, larger by hand.

VSTACK_PROPERTY_EXAMPLES=N  runs N examples per property instead of each test's
                            CI count (e.g. 200 for a local soak);
VSTACK_PROPERTY_RANDOM=1    draws new examples each run (CI draws the same ones:
                            derandomized, so a red CI is reproducible);
VSTACK_PROPERTY_NO_SHRINK=1 reports the first failing example as found (shrinking
                            a failure of a slow property can take minutes).
No example database is written (nothing lands in the checkout)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings


def bounded(examples: int, **kw) -> settings:
    n = int(os.environ.get("VSTACK_PROPERTY_EXAMPLES") or examples)
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=not os.environ.get("VSTACK_PROPERTY_RANDOM"),
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
        print_blob=True,
        phases=[ph for ph in Phase if ph != Phase.shrink]
        if os.environ.get("VSTACK_PROPERTY_NO_SHRINK")
        else list(Phase),
        **kw,
    )
