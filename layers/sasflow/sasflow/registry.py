"""Definitions registered by name and version: immutable versions, the latest of a name, and starts that name one.

``PUT /definitions/{name}/versions/{version}`` stores a version once: the same definition again is answered 200
(nothing written), another one under the same name and version is 409, so a version never changes under the
workflows that run it. A name belongs to the principal that published it first (IAM ARN, or JWT issuer + subject):
another principal's version of it is refused 409, so nobody can take over the "latest" a team starts by name.

A start names ``{"definition": {"name": "...", "version": N}}``, or ``{"name": "..."}`` for the latest version.
The workflow keeps the definition's content id (``WorkflowDefinition.content_id``), so it stays pinned to the
version it started with whatever is published later. Inline definitions keep working.

Items (in the state table, beside the workflows; the API function may read and write only these keys):

- ``pk DEFNAMES, sk <name>``: the name's owner, its latest version and when it was first published;
- ``pk DEFNAME#<name>, sk V#<version, 10 digits>``: the version's content id, who published it and when;
- the definition itself, once per content (``DEF#<content id>``, as for inline definitions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from .definition import WorkflowDefinition
from .errors import ConditionFailedError, InvalidDefinitionError, PermanentError

#: A definition name, as ``WorkflowDefinition.name`` allows.
DefinitionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
DefinitionVersion = Annotated[StrictInt, Field(ge=1, le=2_147_483_647)]


class DefinitionNotFoundError(PermanentError):
    """No definition of that name (or no such version of it): HTTP 404 on the definitions' routes."""


class DefinitionNotRegisteredError(InvalidDefinitionError):
    """A start names a definition that is not registered: HTTP 422 (nothing is written)."""


class DefinitionVersionConflictError(ConditionFailedError):
    """That name and version hold another definition, or the name is another principal's: HTTP 409."""


class DefinitionNameTakenError(DefinitionVersionConflictError):
    """The name was published first by another principal: only it may publish versions of it (HTTP 409)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the definition name {name!r} belongs to another principal: publish its versions as the principal that "
            "first published it, or publish under another name"
        )


class DefinitionRef(BaseModel):
    """A start's reference to a registered definition: its name, and a version (null: the latest)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: DefinitionName
    version: DefinitionVersion | None = None


@dataclass(frozen=True)
class VersionRecord:
    """One registered version: its number, content id, publisher and time (epoch seconds)."""

    version: int
    content_id: str
    owner: str
    created_at: int


@dataclass(frozen=True)
class NameRecord:
    """One registered name: its owner, latest version and first publication (epoch seconds)."""

    name: str
    owner: str
    latest: int
    created_at: int


class DefinitionVersionView(BaseModel):
    """A registered version, as the API shows it (times in epoch seconds)."""

    name: str
    version: int
    content_id: str
    published_by: str
    created_at: int


class DefinitionVersionList(BaseModel):
    """``GET /definitions/{name}``: the name's versions, oldest first."""

    name: str
    owner: str
    latest_version: int
    versions: list[DefinitionVersionView]


class DefinitionSummary(BaseModel):
    """One name of ``GET /definitions``."""

    name: str
    owner: str
    latest_version: int
    created_at: int


class DefinitionList(BaseModel):
    """``GET /definitions``: every registered name, sorted."""

    definitions: list[DefinitionSummary]


class DefinitionRegistry:
    """Publish, list and resolve definitions over a store that implements ``ports.DefinitionStore``."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def publish(
        self, name: str, version: int, definition: WorkflowDefinition, *, owner: str, now: int
    ) -> tuple[bool, DefinitionVersionView]:
        """Register ``definition`` as ``name`` version ``version``; return (created, the version).

        Raises
        ------
        InvalidDefinitionError
            When the definition's own name and version are not the path's.
        DefinitionVersionConflictError
            When the version holds another definition, or the name belongs to another principal.
        """
        if (definition.name, definition.version) != (name, version):
            raise InvalidDefinitionError(
                f"the definition is {definition.name!r} version {definition.version}; the path names {name!r} "
                f"version {version}: they must agree"
            )
        created, record = self.store.put_definition_version(name, version, definition, owner=owner, now=now)
        if record.content_id != definition.content_id:
            raise DefinitionVersionConflictError(
                f"{name} version {version} holds another definition (content {record.content_id}): versions are "
                "immutable, publish the change as a new version"
            )
        return created, _view(name, record)

    def names(self) -> DefinitionList:
        """Every registered name."""
        return DefinitionList(
            definitions=[
                DefinitionSummary(name=n.name, owner=n.owner, latest_version=n.latest, created_at=n.created_at)
                for n in sorted(self.store.definition_names(), key=lambda n: n.name)
            ]
        )

    def versions(self, name: str) -> DefinitionVersionList:
        """The versions of ``name``, oldest first.

        Raises
        ------
        DefinitionNotFoundError
            When nothing is registered under ``name``.
        """
        found = self.store.definition_name(name)
        if found is None:
            raise DefinitionNotFoundError(f"no definition named {name!r}")
        versions = self.store.definition_versions(name)
        return DefinitionVersionList(
            name=name, owner=found.owner, latest_version=found.latest, versions=[_view(name, v) for v in versions]
        )

    def get(self, name: str, version: int | None) -> WorkflowDefinition:
        """The definition of ``name`` at ``version`` (None: the latest).

        Raises
        ------
        DefinitionNotFoundError
            When that name or version is not registered.
        """
        if version is None:
            found = self.store.definition_name(name)
            if found is None:
                raise DefinitionNotFoundError(f"no definition named {name!r}")
            version = found.latest
        definition = self.store.definition_version(name, version)
        if definition is None:
            raise DefinitionNotFoundError(f"no version {version} of definition {name!r}")
        return definition  # type: ignore[no-any-return]

    def resolve(self, ref: DefinitionRef) -> WorkflowDefinition:
        """The definition a start names.

        Raises
        ------
        DefinitionNotRegisteredError
            When it is not registered (the start's 422).
        """
        try:
            return self.get(ref.name, ref.version)
        except DefinitionNotFoundError as exc:
            raise DefinitionNotRegisteredError(
                f"{exc}: publish it with PUT /definitions/{{name}}/versions/{{v}}"
            ) from None


def _view(name: str, record: VersionRecord) -> DefinitionVersionView:
    return DefinitionVersionView(
        name=name,
        version=record.version,
        content_id=record.content_id,
        published_by=record.owner,
        created_at=record.created_at,
    )
