"""``osmosis migrate``: move a workspace written for osmosis-ai (the reference SDK, ``osmosis_ai.rollout``)
onto osmosis.

It rewrites the imports of every Python file (``python_source``, a libcst transformation), the
rollouts' dependencies (``dependencies``), and ``configs/eval/*.toml`` / ``configs/training/*.toml``
into run configs (``run_config``); ``workspace`` plans all of it without writing, then applies it
with a ``<file>.orig`` copy of every file it changes. Whatever has no counterpart is reported with its
file:line (or key) and why, never dropped silently. See MIGRATING.md for the full map.

>>> import pathlib, tempfile
>>> from osmosis_migrate import apply_migration, plan_migration
>>> ws = pathlib.Path(tempfile.mkdtemp())
>>> (ws / "rollouts" / "echo").mkdir(parents=True)
>>> _ = (ws / "rollouts" / "echo" / "main.py").write_text("from osmosis_ai.rollout import AgentWorkflowOutput\\n")
>>> plan = plan_migration(ws)
>>> [c.rel for c in plan.changes], plan.changes[0].new
(['rollouts/echo/main.py'], 'from osmosis_core import RolloutSample\\n')
>>> [p.name for p in apply_migration(plan)], (ws / "rollouts" / "echo" / "main.py.orig").exists()
(['main.py'], True)
>>> plan_migration(ws).changes
()
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_migrate.records import FileChange as FileChange
    from osmosis_migrate.records import Finding as Finding
    from osmosis_migrate.records import MigrateError as MigrateError
    from osmosis_migrate.records import MigrationPlan as MigrationPlan
    from osmosis_migrate.workspace import apply_migration as apply_migration
    from osmosis_migrate.workspace import plan_migration as plan_migration

# imported on first use: the package is loaded by the plugin's entry module on every `osmosis` start
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "records": ["FileChange", "Finding", "MigrateError", "MigrationPlan"],
        "workspace": ["apply_migration", "plan_migration"],
    },
)
