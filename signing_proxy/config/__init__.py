"""The configuration layer: YAML and ``SIGNING_PROXY_*`` variables in, frozen dataclasses out.

Unknown keys, wrong types and bad values are refused with the key path that holds them
(``ConfigError``). Imports only ``core`` and ``errors``; the public names are re-exported here.
"""

from __future__ import annotations

from ..errors import ConfigError
from .build import to_plain
from .checks import AGENT_NAME_RE, host_matches, parse_host_port
from .identity import (
    DEFAULT_REVOCATION_PATH,
    DIRECTORY_MAX_AGE_RANGE_S,
    DelegationConfig,
    PublishConfig,
    RequesterConfig,
    SigningConfig,
)
from .loading import (
    ENV_CONFIG_FILE,
    ENV_OVERRIDES,
    apply_env_overrides,
    load_config,
    parse_config,
)
from .masking import redacted
from .profiles import ProfileRule, ProfilesConfig
from .schema import (
    DISCOVERY_CACHE_MAX_S,
    AccessConfig,
    AdminConfig,
    Config,
    CredentialRule,
    DiscoveryConfig,
    EgressConfig,
    GatewayConfig,
    HostsConfig,
    InterceptConfig,
    LimitsConfig,
    LogConfig,
    RelayConfig,
    RestrictionConfig,
    Route,
    TimeoutsConfig,
    TrustedIssuer,
    UpstreamConfig,
    VerifyConfig,
)

__all__ = [
    "AGENT_NAME_RE",
    "DEFAULT_REVOCATION_PATH",
    "DIRECTORY_MAX_AGE_RANGE_S",
    "DISCOVERY_CACHE_MAX_S",
    "ENV_CONFIG_FILE",
    "ENV_OVERRIDES",
    "AccessConfig",
    "AdminConfig",
    "Config",
    "ConfigError",
    "CredentialRule",
    "DelegationConfig",
    "DiscoveryConfig",
    "EgressConfig",
    "GatewayConfig",
    "HostsConfig",
    "InterceptConfig",
    "LimitsConfig",
    "LogConfig",
    "ProfileRule",
    "ProfilesConfig",
    "PublishConfig",
    "RelayConfig",
    "RequesterConfig",
    "RestrictionConfig",
    "Route",
    "SigningConfig",
    "TimeoutsConfig",
    "TrustedIssuer",
    "UpstreamConfig",
    "VerifyConfig",
    "apply_env_overrides",
    "host_matches",
    "load_config",
    "parse_config",
    "parse_host_port",
    "redacted",
    "to_plain",
]
