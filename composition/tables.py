"""Every package's tables, declared together: the database as a whole.

Importing this module loads each package's declarations onto the one base
(:mod:`flywheel.database`): the migration history compares against the whole, and a
process that builds the store can erase a user from every table that holds them
(``feedback.schema.require_declared`` refuses otherwise).
"""

from __future__ import annotations

import dashboard.tables  # noqa: F401
import feedback.schema  # noqa: F401
import registry.tables  # noqa: F401
from flywheel.database import Base

metadata = Base.metadata
