// @ts-check
// {{name}}: holds posts that mention a watched phrase, for a moderator to
// look at. Config (sidecar `[config]`): `words`, the phrases to watch,
// comma-separated (default "free money, click here").
//
// Types for your editor: `npm run types` writes them from wit/ into types/.

import { log } from "gavel:rules/host@{{contract}}";

/** @typedef {import("gavel:rules/types@{{contract}}").Snapshot} Snapshot */
/** @typedef {import("gavel:rules/types@{{contract}}").Decision} Decision */
/** @typedef {import("gavel:rules/types@{{contract}}").PluginInfo} PluginInfo */

const DEFAULT_WORDS = ["free money", "click here"];

/** @returns {PluginInfo} */
export function info() {
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
 * @param {Snapshot} input
 * @returns {Decision}
 */
export function evaluate(input) {
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
