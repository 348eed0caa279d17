"""The `auth` section: how callers are authenticated."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from gateway.config.loopback import is_loopback
from gateway.config.section import Section

_ALGORITHMS = Literal["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA", "HS256"]


class KeyConfig(Section):
    """A verification key from a file (PEM public key; for HS256 a secret from the environment)."""

    kid: str = Field(min_length=1)
    alg: _ALGORITHMS
    file: str | None = Field(None, description="PEM public key (asymmetric algorithms).")
    secret_env: str | None = Field(
        None, description="Environment variable holding an HS256 secret."
    )

    @model_validator(mode="after")
    def _one_source(self) -> KeyConfig:
        if self.alg == "HS256":
            if self.secret_env is None or self.file is not None:
                raise ValueError("an HS256 key takes secret_env (and no file)")
        elif self.file is None or self.secret_env is not None:
            raise ValueError(f"a {self.alg} key takes file (a PEM public key), not secret_env")
        return self


class ResourceMetadataConfig(Section):
    """RFC 9728 Protected Resource Metadata, served under /.well-known/oauth-protected-resource."""

    authorization_servers: tuple[str, ...] = ()
    scopes_supported: tuple[str, ...] = ()
    url: str | None = Field(
        None,
        description="Where clients fetch the metadata; default: derived from `audience` "
        "(https://host/.well-known/oauth-protected-resource/<path>).",
    )


class AuthConfig(Section):
    """How callers are authenticated: `jwt`, or `none` for local development on loopback only."""

    mode: Literal["none", "jwt"] = "none"
    issuer: str | None = None
    audience: str | None = Field(None, description="taskgate's own resource URI.")
    jwks_url: str | None = None
    keys: tuple[KeyConfig, ...] = ()
    algorithms: tuple[_ALGORITHMS, ...] = ("ES256", "RS256", "EdDSA")
    tenant_claim: str = "tenant"
    principal_claim: str = "sub"
    leeway_s: float = Field(30.0, ge=0, le=600)
    jwks_refresh_s: float = Field(300.0, gt=0, description="How long fetched keys are trusted.")
    jwks_min_refresh_s: float = Field(
        30.0, ge=0, description="An unknown kid refetches the JWKS at most this often."
    )
    token_cache_size: int = Field(
        10_000, ge=0, description="Verified tokens remembered (by hash, never past exp; 0: off)."
    )
    task_sharing: Literal["principal", "tenant"] = Field(
        "principal",
        description="principal: a task belongs to the principal that created it. tenant: every "
        "principal of the creating tenant may use it.",
    )
    resource_metadata: ResourceMetadataConfig = ResourceMetadataConfig()

    @model_validator(mode="after")
    def _jwt_is_complete(self) -> AuthConfig:
        if self.mode != "jwt":
            return self
        missing = [k for k in ("issuer", "audience") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"mode jwt needs {' and '.join(missing)}")
        if (self.jwks_url is None) == (not self.keys):
            raise ValueError("mode jwt needs exactly one of jwks_url and keys")
        if "HS256" in self.algorithms and self.jwks_url is not None:
            raise ValueError("HS256 takes configured secrets (keys), never keys from a JWKS URL")
        if any(key.alg not in self.algorithms for key in self.keys):
            raise ValueError("every key's alg must be listed in algorithms")
        if self.jwks_url is not None:
            parts = urlsplit(self.jwks_url)
            if parts.scheme != "https" and not (
                parts.scheme == "http" and is_loopback(parts.hostname)
            ):
                raise ValueError("jwks_url must be https (plain http only on loopback)")
        return self
