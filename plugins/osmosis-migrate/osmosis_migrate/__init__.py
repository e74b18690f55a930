"""``osmosis migrate``: move a workspace written for osmosis-ai (the reference SDK, ``osmosis_ai.rollout``)
onto osmosis.

It rewrites the imports of every Python file (``python_source``, a libcst transformation), the
rollouts' dependencies (``dependencies``), and ``configs/eval/*.toml`` / ``configs/training/*.toml``
into run configs (``run_config``); ``workspace`` plans all of it without writing, then applies it
with a ``<file>.orig`` copy of every file it changes. Whatever has no counterpart is reported with its
file:line (or key) and why, never dropped silently. See MIGRATING.md for the full map.

>>> import pathlib, tempfile
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

from osmosis_migrate.records import FileChange, Finding, MigrateError, MigrationPlan
from osmosis_migrate.workspace import apply_migration, plan_migration

__version__ = "0.2.0"

__all__ = ["FileChange", "Finding", "MigrateError", "MigrationPlan", "apply_migration", "plan_migration"]
