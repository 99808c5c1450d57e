"""Table maintenance: compaction, manifest merge, expiry that frees storage, orphan sweep.

The run loop calls :meth:`Maintainer.run_due` between batches; ``sparkapply maintain``
calls :meth:`Maintainer.run`. Only this package and ``apply/`` and ``copy/`` import
pyspark; the Iceberg side of maintenance lives in ``sink/`` (``rewrite.py``,
``maintenance.py``).
"""

from sparkapply.maintain.maintainer import Maintainer, MaintenanceReport

__all__ = ["Maintainer", "MaintenanceReport"]
