// @ts-check
// Shouting, in JavaScript: holds posts written mostly in capitals. The twin
// of the Python example (plugins/python/shouting/app.py), case for case, so
// the two languages can be compared on the same work (docs/BENCHMARKS.md B2).
//
// Built into a WebAssembly component with jco (componentize-js), every WASI
// feature disabled so the component imports only the gavel:rules contract:
//
//     npm ci && npm run build
//
// Config (sidecar `[config]`): `min_letters` (default 12) letters before the
// rule looks at case; `caps_ratio` (default 0.8) share of capitals that
// counts as shouting; three `!` or more in a row turn a hold into a reject,
// and so does an author whose account standing is not `good`;
// `exempt_authors` names a `strings` list of author ids (official accounts,
// say) the rule leaves alone: moderators edit it at runtime, and a list the
// host does not have exempts nobody.

import { log } from "gavel:rules/host@0.3.2";
import { contains } from "gavel:rules/lists@0.3.2";

/** @typedef {import("gavel:rules/types@0.3.2").Snapshot} Snapshot */
/** @typedef {import("gavel:rules/types@0.3.2").Decision} Decision */
/** @typedef {import("gavel:rules/types@0.3.2").PluginInfo} PluginInfo */

/**
 * A numeric config value, or `fallback` when absent. A value that does not
 * parse is thrown: the evaluation's outcome is `error`, naming the key.
 * @param {Snapshot} snapshot
 * @param {string} key
 * @param {number} fallback
 */
function config(snapshot, key, fallback) {
  const raw = snapshot.config.find(([k]) => k === key)?.[1];
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (raw.trim() === "" || Number.isNaN(value)) {
    throw `config \`${key}\`: cannot parse ${JSON.stringify(raw)}`;
  }
  return value;
}

/**
 * Whether the list config `exempt_authors` names holds the item's author. A
 * list error comes back thrown, its `payload` the WIT `list-error`.
 * @param {Snapshot} snapshot
 */
function exempt(snapshot) {
  const name = snapshot.config.find(([k]) => k === "exempt_authors")?.[1];
  if (name === undefined) return false;
  try {
    return contains(name, snapshot.item.author);
  } catch (e) {
    const error = /** @type {{payload?: {tag: string, val?: string}}} */ (e).payload;
    if (error?.tag === "unknown") return false;
    throw `list \`${name}\`: ${error ? `${error.tag} ${error.val ?? ""}`.trim() : String(e)}`;
  }
}

/** @returns {PluginInfo} */
export function info() {
  return {
    name: "shouting-js",
    version: "1.2.0",
    description: "Holds posts written mostly in capitals (JavaScript)",
    phases: ["async"],
  };
}

/**
 * @param {Snapshot} input
 * @returns {Decision}
 */
export function evaluate(input) {
  const minLetters = config(input, "min_letters", 12);
  const capsRatio = config(input, "caps_ratio", 0.8);
  /** @type {Decision} */
  const allow = { verdict: "allow", score: 0, labels: [], reason: "" };
  if (exempt(input)) return { ...allow, reason: "exempt author" };
  const text = input.item.text;
  // Letters that have a case, as `c.lower() != c.upper()` in the Python
  // twin: scripts without capitals neither count as shouting nor dilute it.
  const letters = [...text].filter((c) => c.toLowerCase() !== c.toUpperCase());
  if (letters.length < minLetters) return allow;
  const upper = letters.filter((c) => c === c.toUpperCase()).length;
  const ratio = upper / letters.length;
  if (ratio < capsRatio) return allow;
  const reason = `${Math.round(ratio * 100)}% of ${letters.length} letters are capitals`;
  const score = Math.min(1, ratio);
  if (text.includes("!!!")) {
    log("info", `item ${input.item.id}: shouting with exclamation marks`);
    return { verdict: "reject", score, labels: ["shouting"], reason: `${reason}, with !!!` };
  }
  // As in the Python twin: an author in another state than `good` (the
  // host's `[standing]` tiers, e.g. `watch`) has enforced decisions against
  // them lately, so their shouting is rejected rather than held.
  const state = input.author.standing.state;
  if (state !== "good") {
    return { verdict: "reject", score, labels: ["shouting"], reason: `${reason}, by an author in standing \`${state}\`` };
  }
  return { verdict: "hold", score, labels: ["shouting"], reason };
}
