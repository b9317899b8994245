"""Shouting: holds posts written mostly in capitals, gavel's example rule in Python.

Built into a WebAssembly component with componentize-py against the same WIT
contract as the Rust rules:

    componentize-py -d ../../../wit -w rule componentize --stub-wasi app -o shouting.wasm

(`--stub-wasi`: CPython's file and socket imports become stubs that trap;
gavel refuses a component that imports them.)

Config (sidecar `[config]`): `min_letters` (default 12) letters with case before the
rule looks at case; `caps_ratio` (default 0.8) share of capitals that counts
as shouting; three `!` or more in a row turn a hold into a reject, and so
does an author whose account standing is not `good`; `exempt_authors` names
a `strings` list of author ids (official accounts, say) the rule leaves
alone: moderators edit it at runtime, and a list the host does not have
exempts nobody.
"""

import wit_world
from wit_world.imports import host, lists
from wit_world.imports.types import Decision, Level, Phase, PluginInfo, Snapshot, Verdict
from componentize_py_types import Err


def config(snapshot: Snapshot, key: str, default: float) -> float:
    for k, v in snapshot.config:
        if k == key:
            try:
                return float(v)
            except ValueError:
                raise Err(f"config `{key}`: cannot parse {v!r}")
    return default


def exempt(snapshot: Snapshot) -> bool:
    """Whether the list config `exempt_authors` names holds the item's author."""
    name = next((v for k, v in snapshot.config if k == "exempt_authors"), None)
    if name is None:
        return False
    try:
        return lists.contains(name, snapshot.item.author)
    except Err as e:
        if isinstance(e.value, lists.ListError_Unknown):
            return False
        tag = "wrong-kind" if isinstance(e.value, lists.ListError_WrongKind) else "invalid"
        raise Err(f"list `{name}`: {tag} {e.value.value}")


class WitWorld(wit_world.WitWorld):
    def info(self) -> PluginInfo:
        return PluginInfo(
            name="shouting",
            version="1.2.0",
            description="Holds posts written mostly in capitals",
            phases=[Phase.ASYNC],
        )

    def evaluate(self, input: Snapshot) -> Decision:
        min_letters = config(input, "min_letters", 12)
        caps_ratio = config(input, "caps_ratio", 0.8)
        if exempt(input):
            return Decision(verdict=Verdict.ALLOW, score=0.0, labels=[], reason="exempt author", provider=None)
        text = input.item.text
        # Letters that have a case: scripts without capitals (Japanese,
        # Arabic, ...) neither count as shouting nor dilute it.
        letters = [c for c in text if c.lower() != c.upper()]
        if len(letters) < min_letters:
            return Decision(verdict=Verdict.ALLOW, score=0.0, labels=[], reason="", provider=None)
        upper = sum(1 for c in letters if c.isupper())
        ratio = upper / len(letters)
        if ratio < caps_ratio:
            return Decision(verdict=Verdict.ALLOW, score=0.0, labels=[], reason="", provider=None)
        reason = f"{ratio:.0%} of {len(letters)} letters are capitals"
        if "!!!" in text:
            host.log(Level.INFO, f"item {input.item.id}: shouting with exclamation marks")
            return Decision(verdict=Verdict.REJECT, score=min(1.0, ratio), labels=["shouting"], reason=reason + ", with !!!", provider=None)
        # An author in another state than `good` (the host's `[standing]`
        # tiers, e.g. `watch`) has enforced decisions against them lately:
        # their shouting is rejected rather than held for a moderator.
        state = input.author.standing.state
        if state != "good":
            return Decision(verdict=Verdict.REJECT, score=min(1.0, ratio), labels=["shouting"], reason=f"{reason}, by an author in standing `{state}`", provider=None)
        return Decision(verdict=Verdict.HOLD, score=min(1.0, ratio), labels=["shouting"], reason=reason, provider=None)
