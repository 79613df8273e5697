"""Non-stationary environments of sb3-plastic, installed as ``sb3_plastic.envs``.

The folder ``envs/`` of the repository is mapped onto the package ``sb3_plastic.envs`` (see
``pyproject.toml``), so installing sb3-plastic never creates a top-level module named ``envs``.
Importing this package registers the gymnasium ids of the namespace ``sb3_plastic/``.
"""

from __future__ import annotations

#: Gymnasium ids registered by this package (filled as environments are added).
REGISTERED_IDS: list[str] = []
