"""Built-in drivers, one module each: ``from adaptor.drivers import script``.

Every module exposes ``Config`` (a frozen dataclass with the common fields ``command``, ``env``,
``extra_args``, ``cwd`` and ``grace_period``) and ``Driver(config)``, which snapshots the config
and does no I/O until ``run``.  Modules are not imported here so that importing one driver never
pulls in the others.
"""

# The value a run request's "driver" may take: the module of that name here.
NAMES = ("claude", "codex", "cursor", "codebuddy", "gemini", "command", "script")
