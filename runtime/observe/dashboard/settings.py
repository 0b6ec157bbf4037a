"""pop.toml ``[dashboard]``: the live dashboard on the admin listener.

    [dashboard]
    enabled = true     # false: no aggregator observes the events; /dashboard answers 404
"""

from __future__ import annotations

from msgspec import Struct


class DashboardSettings(Struct, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
