"""The daemon's TOML configuration file.

```toml
workers = 4
grace = 30

[drivers.claude]            # default driver config, merged under each request's "config"
command = "/usr/local/bin/claude"

[tools]
lookup_issue = "mytools.issues:lookup"   # host tools a request may select by name

[skills]
dirs = ["/home/me/skills"]                # skill catalogue directories
```
"""

from __future__ import annotations

import importlib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The configuration file is unreadable or has a bad value; names the file and key."""


@dataclass(frozen=True)
class DaemonConfig:
    workers: int = 4
    grace: float = 30.0
    scan_interval: float = 2.0
    drivers: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    skill_dirs: tuple[str, ...] = ()
    source: str | None = None

    def driver_defaults(self, name: str) -> dict[str, Any]:
        return dict(self.drivers.get(name, {}))

    def load_tools(self) -> dict[str, Any]:
        """Import every configured host tool (``module:attribute``)."""
        loaded: dict[str, Any] = {}
        for name, target in self.tools.items():
            module_name, _, attribute = target.partition(":")
            if not module_name or not attribute:
                raise ConfigError(f"tools.{name}: expected 'module:attribute', got {target!r}")
            try:
                obj: Any = importlib.import_module(module_name)
                for part in attribute.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"tools.{name}: cannot load {target!r}: {exc}") from exc
            loaded[name] = obj
        return loaded


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "adaptord" / "config.toml"


def load(path: str | os.PathLike[str] | None, *, required: bool = False) -> DaemonConfig:
    """Read the config file; a missing default file means defaults, a missing explicit one fails."""
    target = Path(path) if path is not None else default_config_path()
    try:
        raw = tomllib.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{target}: no such file") from None
        return DaemonConfig()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{target}: {exc}") from exc
    return _parse(raw, str(target))


def _parse(raw: dict[str, Any], source: str) -> DaemonConfig:
    known = {"workers", "grace", "scan_interval", "drivers", "tools", "skills"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown setting(s): {', '.join(unknown)}")
    workers = raw.get("workers", 4)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 256:
        raise ConfigError(f"{source}: workers must be an integer from 1 to 256")
    grace = raw.get("grace", 30)
    if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < 0:
        raise ConfigError(f"{source}: grace must be a number of seconds >= 0")
    scan = raw.get("scan_interval", 2.0)
    if not isinstance(scan, int | float) or isinstance(scan, bool) or not 0.05 <= scan <= 300:
        raise ConfigError(f"{source}: scan_interval must be from 0.05 to 300 seconds")
    drivers = raw.get("drivers", {})
    if not isinstance(drivers, dict) or not all(isinstance(v, dict) for v in drivers.values()):
        raise ConfigError(f"{source}: [drivers.<name>] tables expected")
    tools = raw.get("tools", {})
    if not isinstance(tools, dict) or not all(isinstance(v, str) for v in tools.values()):
        raise ConfigError(f"{source}: [tools] maps names to 'module:attribute' strings")
    skills = raw.get("skills", {})
    dirs = skills.get("dirs", []) if isinstance(skills, dict) else None
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(f"{source}: skills.dirs must be a list of paths")
    return DaemonConfig(
        workers=workers,
        grace=float(grace),
        scan_interval=float(scan),
        drivers={str(k): dict(v) for k, v in drivers.items()},
        tools=dict(tools),
        skill_dirs=tuple(dirs),
        source=source,
    )
