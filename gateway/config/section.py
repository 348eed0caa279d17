"""The base of every section of the configuration file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A part of the configuration: frozen, and a key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)
