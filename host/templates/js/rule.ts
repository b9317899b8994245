// {{name}}: holds posts that mention a watched phrase, for a moderator to
// look at. Config (sidecar `[config]`): `words`, the phrases to watch,
// comma-separated (default "free money, click here").
//
// The types come from wit/: `npm run types` writes them into types/.

import type { Decision, PluginInfo, Snapshot } from "gavel:rules/rule@{{contract}}";
import { log } from "gavel:rules/host@{{contract}}";

const DEFAULT_WORDS = ["free money", "click here"];

export function info(): PluginInfo {
  return {
    name: "{{name}}",
    version: "0.1.0",
    description: "Holds posts that mention a watched phrase",
    phases: ["async"],
  };
}

/**
 * Judges one snapshot. Throw a string to report "cannot decide" (recorded
 * with outcome `error`; the other rules still decide).
 */
export function evaluate(input: Snapshot): Decision {
  const raw = input.config.find(([key]) => key === "words")?.[1];
  const words = raw === undefined ? DEFAULT_WORDS : raw.split(",").map((w) => w.trim()).filter((w) => w !== "");
  const text = input.item.text.toLowerCase();
  const word = words.find((w) => text.includes(w.toLowerCase()));
  if (word !== undefined) {
    log("debug", `item ${input.item.id}: mentions ${JSON.stringify(word)}`);
    return { verdict: "hold", score: 0.6, labels: ["watch-word"], reason: `mentions ${JSON.stringify(word)}` };
  }
  return { verdict: "allow", score: 0, labels: [], reason: "" };
}
