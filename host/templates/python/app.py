"""{{name}}: holds posts that mention a watched phrase, for a moderator to look at.

Config (sidecar `[config]`): `words`, the phrases to watch, comma-separated
(default "free money, click here").
"""

import wit_world
from wit_world.imports import host
from wit_world.imports.types import Decision, Level, Phase, PluginInfo, Snapshot, Verdict

DEFAULT_WORDS = ["free money", "click here"]


def config(snapshot: Snapshot, key: str) -> str | None:
    for k, v in snapshot.config:
        if k == key:
            return v
    return None


class WitWorld(wit_world.WitWorld):
    def info(self) -> PluginInfo:
        return PluginInfo(
            name="{{name}}",
            version="0.1.0",
            description="Holds posts that mention a watched phrase",
            phases=[Phase.ASYNC],
        )

    def evaluate(self, input: Snapshot) -> Decision:
        # To report "cannot decide", raise componentize_py_types.Err("why").
        words = config(input, "words")
        words = [w.strip() for w in words.split(",")] if words is not None else DEFAULT_WORDS
        text = input.item.text.lower()
        for word in words:
            if word and word.lower() in text:
                host.log(Level.DEBUG, f"item {input.item.id}: mentions {word!r}")
                return Decision(verdict=Verdict.HOLD, score=0.6, labels=["watch-word"],
                                reason=f"mentions {word!r}", provider=None)
        return Decision(verdict=Verdict.ALLOW, score=0.0, labels=[], reason="", provider=None)
