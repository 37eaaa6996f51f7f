"""``ENVIRONMENT`` and ``CHECKPOINTER_BACKEND``: the deployment variables other agent kits use.

``ENVIRONMENT`` says whose process this is: ``dev`` (the default) or ``prod``. Production
refuses what only a developer should choose, each at start with one line naming the setting:
the memory backend (every run is lost with the process) and disabled redaction (secrets reach
durable stores in clear). The name is a common one, set for other tools too, so the usual
spellings are read (``staging`` as ``prod``: it stands in for production; ``test``, ``ci`` and
``local`` as ``dev``); any other value is refused rather than read as one of the two, since a
misspelt ``prod`` must not quietly turn those refusals off.

``CHECKPOINTER_BACKEND`` is another name for ``ONWARD_BACKEND``, so a deployment configured
for a kit that names its backends ``session_service``, ``postgres`` and ``memory`` keeps its
variable: each maps to the Onward backend of the same standing (`CHECKPOINTER_BACKENDS`).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any, Literal

from onward.errors import ConfigurationError

ENVIRONMENT_VARIABLE = "ENVIRONMENT"

Environment = Literal["dev", "prod"]

_ENVIRONMENTS: Mapping[str, Environment] = {
    "dev": "dev",
    "development": "dev",
    "local": "dev",
    "test": "dev",
    "testing": "dev",
    "ci": "dev",
    "prod": "prod",
    "production": "prod",
    "staging": "prod",
    "stage": "prod",
}

CHECKPOINTER_BACKENDS: Mapping[str, str] = {
    "session_service": "kafka",
    "postgres": "postgres",
    "memory": "memory",
    "kafka": "kafka",
    "sqlite": "sqlite",
}
"""``CHECKPOINTER_BACKEND`` value -> ``ONWARD_BACKEND`` value. ``session_service`` (the other
kits' durable, distributed production backend) is ``kafka``; ``postgres`` and ``memory`` keep
their names; Onward's own names are taken as they are."""


def parse_environment(value: str) -> Environment:
    """``dev`` or ``prod`` from a value of ``ENVIRONMENT``, in any case (`_ENVIRONMENTS`).

    Raises:
        ValueError: Any other value (`Settings` turns it into its one-line error).
    """
    environment = _ENVIRONMENTS.get(value.strip().lower())
    if environment is None:
        raise ValueError(
            f"must be dev or prod (or {', '.join(sorted(set(_ENVIRONMENTS) - {'dev', 'prod'}))}), "
            f"got {value[:40]!r}"
        )
    return environment


def current_environment() -> Environment:
    """The environment ``ENVIRONMENT`` names now (unset or empty: ``dev``).

    Raises:
        ConfigurationError: It names neither.
    """
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if not value:
        return "dev"
    try:
        return parse_environment(value)
    except ValueError as exc:
        raise ConfigurationError(f"invalid configuration: {ENVIRONMENT_VARIABLE}: {exc}") from None


def refuse_disabled_redaction() -> None:
    """Refuse to turn redaction off in production.

    Raises:
        ConfigurationError: ``ENVIRONMENT`` is ``prod`` (or names no environment).
    """
    if current_environment() == "prod":
        raise ConfigurationError(
            f"invalid configuration: {ENVIRONMENT_VARIABLE}=prod refuses disabled redaction "
            "(Redactor(enabled=False)): secrets would reach the log and the stores in clear; "
            f"keep redaction on, or set {ENVIRONMENT_VARIABLE}=dev"
        )


def refuse_memory_backend(environment: Environment, backend: str) -> None:
    """Refuse the memory backend in production.

    Raises:
        ConfigurationError: ``environment`` is ``prod`` and ``backend`` is ``memory``.
    """
    if environment == "prod" and backend == "memory":
        raise ConfigurationError(
            f"invalid configuration: {ENVIRONMENT_VARIABLE}=prod refuses ONWARD_BACKEND=memory: "
            "every run would be lost with the process; use sqlite or kafka, or set "
            f"{ENVIRONMENT_VARIABLE}=dev"
        )


def with_checkpointer_backend(data: Any, backends: Collection[str]) -> Any:
    """Settings input with ``CHECKPOINTER_BACKEND`` read as the ``ONWARD_BACKEND`` it maps to.

    Args:
        data: What `Settings` is being built from: variables by name (``ONWARD_BACKEND``) or
            fields by name (``backend``).
        backends: The values ``ONWARD_BACKEND`` takes.

    Raises:
        ConfigurationError: ``CHECKPOINTER_BACKEND`` names no backend, or one this Onward does
            not have, or it and ``ONWARD_BACKEND`` are both set and name different backends.
    """
    if not isinstance(data, dict):
        return data
    alias = next((k for k in ("CHECKPOINTER_BACKEND", "checkpointer_backend") if k in data), None)
    given = data.get(alias) if alias is not None else None
    if given is None or given == "":
        return data
    if alias == "CHECKPOINTER_BACKEND" and data.get("backend") not in (None, ""):
        # The field given by name came from Python (the environment gives variables), and wins
        # over the environment's CHECKPOINTER_BACKEND as it wins over its ONWARD_BACKEND.
        return data
    name = str(given).strip().lower()
    mapped = CHECKPOINTER_BACKENDS.get(name)
    if mapped is None:
        raise ConfigurationError(
            f"invalid configuration: CHECKPOINTER_BACKEND={str(given)[:40]!r} names no backend; "
            f"it is one of {', '.join(CHECKPOINTER_BACKENDS)} (or set ONWARD_BACKEND)"
        )
    if mapped not in backends:
        raise ConfigurationError(
            f"invalid configuration: CHECKPOINTER_BACKEND={name} means ONWARD_BACKEND={mapped}, "
            f"which this Onward does not have (it has {', '.join(backends)})"
        )
    key = next((k for k in ("ONWARD_BACKEND", "backend") if k in data), None)
    if key is not None and data[key] not in (None, ""):
        if str(data[key]) != mapped:
            raise ConfigurationError(
                f"invalid configuration: CHECKPOINTER_BACKEND={name} (ONWARD_BACKEND={mapped}) "
                f"and ONWARD_BACKEND={str(data[key])[:40]} disagree; set one of them"
            )
        return data
    return {**data, "ONWARD_BACKEND": mapped}


__all__ = [
    "CHECKPOINTER_BACKENDS",
    "ENVIRONMENT_VARIABLE",
    "Environment",
    "current_environment",
    "parse_environment",
    "refuse_disabled_redaction",
    "refuse_memory_backend",
    "with_checkpointer_backend",
]
