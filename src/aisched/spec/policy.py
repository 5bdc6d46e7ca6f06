"""Policy files: YAML naming the cycle's actions and plugins, read here and built by the core.

`load_policy(spec)` takes a preset name or a path to a YAML file. The mapping's meaning is the
core's (`aisched.core.policy.build_policy`); this module only reads the file and turns every
problem into a SpecError that names the file and the entry.
"""

from __future__ import annotations

from pathlib import Path

from aisched.core.policy import PRESETS, Policy, PolicyError, build_policy, preset
from aisched.spec.errors import SpecError, parse_yaml, read_text_file


def load_policy_file(path: str | Path) -> Policy:
    p = Path(path)
    data = parse_yaml(read_text_file(p, "policy file"), str(p))
    if not isinstance(data, dict):
        raise SpecError(f"{p}: a policy file must be a mapping")
    try:
        return build_policy(data, name=str(data.get("name") or p.stem))
    except PolicyError as e:
        raise SpecError(f"{p}: {e}") from None


def load_policy(spec: str) -> Policy:
    """A preset name, or a path to a YAML policy file (anything ending in .yaml/.yml or that
    exists on disk)."""
    if spec in PRESETS:
        return preset(spec)
    # Not "" (the path of "."): `policy: ""` was read as the current directory's policy file.
    if spec and (spec.endswith((".yaml", ".yml")) or _exists(spec)):
        return load_policy_file(spec)
    raise SpecError(
        f"unknown policy {spec!r}; presets: {', '.join(sorted(PRESETS))}, or a YAML file"
    )


def _exists(path: str) -> bool:
    # Path.exists raises for a name the system refuses (longer than NAME_MAX: a traceback
    # from `aisched up --policy`); such a name is no file, so it is a preset name or nothing.
    try:
        return Path(path).exists()
    except OSError:
        return False
