"""The start-up notice of keys that have no effect in a run, derived from the resolver's own
record (`RunSpec.keys`); ``python -m jrl.train --explain`` (`jrl.runspec.explain`) says the same
key by key.

A key the user set away from its default has no effect when the resolver did not read it, nor
any key that follows it by interpolation (``rollout.response_length`` follows
``data.max_response_length``): why is the reason the resolver gave where its choice left the key
unread (`KeyReads.skip`: the critic's keys under GRPO, the cosine options under a constant
schedule), else `no_effect.UNREAD`'s (keys of torch, Ray or Megatron that no resolver reads). A
key the resolver reads acts, unless this host or the engine that generates here leaves it idle
(`no_effect.IDLE_HERE`). Keys of features jrl does not implement are config errors instead
(`jrl.runspec.unsupported`). Untouched defaults say nothing.
"""

from __future__ import annotations

from collections.abc import Collection

from ml_collections import ConfigDict

from jrl.config.moved import followers, key_matches, moved_settings
from jrl.runspec.no_effect import IDLE_HERE, UNREAD
from jrl.runspec.reads import KeyRecord

NOT_READ = "no part of this run reads it"


def no_effect_reason(
    key: str,
    config: ConfigDict,
    keys: KeyRecord,
    engine: str,
    given: Collection[str] | None = None,
) -> str | None:
    """Why `key` has no effect in the run of `config` whose resolver left `keys` and whose
    rollout `engine` generates, or None when it acts. A key of a part the run does not have
    (`Skip.given_only`) counts only when in `given` (the command line's; None: every key)."""
    idle = next(
        (i.reason for i in IDLE_HERE if key_matches(i.pattern, key) and i.applies(config, engine)),
        None,
    )
    if idle is not None:
        return idle
    if keys.read(key) or any(keys.read(f) for f in followers(config, key)):
        return None  # read, itself or through the keys that follow it by interpolation
    skip = keys.skip_of(key)
    if skip is None:
        return next((why for pattern, why in UNREAD.items() if key_matches(pattern, key)), NOT_READ)
    if skip.given_only and given is not None:
        return skip.reason if any(key == g or key.startswith(f"{g}.") for g in given) else None
    return skip.reason


def ignored_settings(
    config: ConfigDict, keys: KeyRecord, engine: str, given: Collection[str] = ()
) -> dict[str, list]:
    """{reason: [(key, value), ...]} of the keys set away from their defaults that have no
    effect (`no_effect_reason`; keys that only follow another setting are left out)."""
    found: dict[str, list] = {}
    for key, value in moved_settings(config, lambda key: True):
        reason = no_effect_reason(key, config, keys, engine, given)
        if reason is not None:
            found.setdefault(reason, []).append((key, value))
    return found


def no_effect_notice(
    config: ConfigDict, keys: KeyRecord, engine: str, given: Collection[str] = ()
) -> str | None:
    """The start-up notice (one line per reason) of `ignored_settings`, or None."""
    found = ignored_settings(config, keys, engine, given)
    if not found:
        return None
    lines = ["jrl: these settings have no effect in this run:"]
    for reason, pairs in found.items():
        keys_said = ", ".join(f"{k}={v!r}" for k, v in pairs)
        lines.append(f"  {keys_said} ({reason})")
    return "\n".join(lines)
