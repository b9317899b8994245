// The moderator console (/console) in a real browser: Debian's Chromium
// driven through playwright-core, two moderators side by side, against a
// running gavel whose review queue holds at least 6 items (the Rust suite,
// tests/tests/suite/console.rs, prepares it and reads the JSON line this
// prints). The DOM and HTTP contract it checks is the console's own.
//
//   GAVEL_URL     base URL of gavel, e.g. http://127.0.0.1:8080
//   MOD_TOKEN     token of moderator `mod`
//   MOD2_TOKEN    token of moderator `mod2`
//   CLIENT_TOKEN  a client token (the console must refuse it)
//   XSS_ITEM      id of a held item whose text carries HTML and a script
//   APPEAL_ITEM   id of a rejected item with the one open appeal
//   SHOTS         directory for the screenshots
//   CHROMIUM      the browser (default /usr/bin/chromium)
//
// Exits non-zero with the failed step on stderr, also on any dialog, page
// error or console error. Progress goes to stderr; stdout gets one line:
// {"keyboard_decided", "stale_item", "claimed", "skipped", "appeal_overturned"}.

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const TIMEOUT_MS = 30_000;
const XSS_IMG = "<img src=x onerror=alert(1)>";
const XSS_SCRIPT = "<script>alert(2)</script>";
// Claims go oldest first; decisions on the XSS item would spoil its checks.
const XSS_CLAIMED = "the XSS item was claimed: it must be the newest held item, so that it is claimed last";

function setting(name, fallback) {
  const value = process.env[name] || fallback;
  if (!value) {
    console.error(`e2e: ${name} is not set`);
    process.exit(2);
  }
  return value;
}

const base = setting("GAVEL_URL").replace(/\/+$/, "");
const modToken = setting("MOD_TOKEN");
const mod2Token = setting("MOD2_TOKEN");
const clientToken = setting("CLIENT_TOKEN");
const xssItem = setting("XSS_ITEM");
const appealItem = setting("APPEAL_ITEM");
const shots = setting("SHOTS");
const executablePath = setting("CHROMIUM", "/usr/bin/chromium");

/**
 * What went wrong outside a check: dialogs, page errors, console errors.
 * Chromium logs a console error for every document answered with 4xx, so
 * such an error carries an `excuse` ("409 <url>"), and counts only unless a
 * step expected exactly that answer (`answered`).
 */
const problems = [];
const answered = new Set();
let current = "start-up";

class CheckFailed extends Error {}

function check(condition, message) {
  if (!condition) throw new CheckFailed(message);
}

function unexcused() {
  return problems.filter((p) => !answered.has(p.excuse)).map((p) => p.text);
}

function clean() {
  const left = unexcused();
  check(left.length === 0, left.join("\n"));
}

function step(name) {
  clean();
  current = name;
  console.error(`e2e: ${name}`);
}

const itemPath = (id) => `/console/items/${encodeURIComponent(id)}`;

/** The item id of an item page, or null elsewhere. */
function itemOf(page) {
  const m = new URL(page.url()).pathname.match(/^\/console\/items\/([^/]+)$/);
  return m && decodeURIComponent(m[1]);
}

const pathOf = (page) => new URL(page.url()).pathname;

/** Polls `probe` until it returns something truthy (or fails after the timeout). */
async function until(what, probe) {
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    clean();
    const value = await probe();
    if (value) return value;
    check(Date.now() < deadline, `timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Runs `action` (a click, a key, a goto) and waits for the page's next
 * document to load; checks its status (after redirects) is `status`.
 */
async function navigate(page, action, status = 200) {
  const isDocument = (r) =>
    r.request().isNavigationRequest() && r.frame() === page.mainFrame() && (r.status() < 300 || r.status() >= 400);
  const response = page.waitForEvent("response", { predicate: isDocument });
  const committed = page.waitForEvent("framenavigated", { predicate: (f) => f === page.mainFrame() });
  await action();
  const [r] = await Promise.all([response, committed]);
  await page.waitForLoadState("load");
  check(r.status() === status, `${r.request().method()} ${r.url()} answered ${r.status()}, expected ${status}`);
  if (status !== 200) answered.add(`${status} ${r.url()}`);
}

async function open(page, path) {
  await navigate(page, () => page.goto(`${base}${path}`));
}

async function shot(page, name) {
  await page.screenshot({ path: join(shots, name), fullPage: true });
}

/** The item through the JSON API, as moderator `mod`. */
async function apiItem(id) {
  const r = await fetch(`${base}/v1/items/${encodeURIComponent(id)}`, {
    headers: { Authorization: `Bearer ${modToken}` },
  });
  check(r.ok, `GET /v1/items/${id} answered ${r.status}`);
  return r.json();
}

/** The console's cookie `name` (they have Path=/console). */
async function cookie(context, name) {
  return (await context.cookies(`${base}/console/`)).find((c) => c.name === name);
}

async function statusOf(page) {
  return page.getAttribute("#item-status", "data-status");
}

/** Presses a status shortcut: its radio is checked and #reason focused. */
async function statusKey(page, key, status) {
  await page.keyboard.press(key);
  await until(`${key} to check #status-${status} and focus #reason`, async () => {
    const focused = await page.evaluate(() => document.activeElement?.id);
    return focused === "reason" && (await page.isChecked(`#status-${status}`));
  });
}

/** Where a claim landed: the item id, or null on the queue saying it is empty. */
async function nextItemOrEmpty(page) {
  const id = itemOf(page);
  if (id) return id;
  check(pathOf(page) === "/console/queue", `expected an item page or the queue, got ${page.url()}`);
  await page.locator("#queue-empty").waitFor({ state: "visible" });
  return null;
}

/** Clicks "Start reviewing" on the queue; where it landed, as `nextItemOrEmpty`. */
async function startReviewing(page) {
  await open(page, "/console/queue");
  await navigate(page, () => page.click("#start"));
  return nextItemOrEmpty(page);
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });

async function newContext(label) {
  const context = await browser.newContext();
  context.setDefaultTimeout(TIMEOUT_MS);
  context.setDefaultNavigationTimeout(TIMEOUT_MS);
  context.on("dialog", (dialog) => {
    problems.push({ text: `${label}: a ${dialog.type()} dialog opened: ${dialog.message()}` });
    dialog.dismiss().catch(() => {});
  });
  context.on("weberror", (e) => problems.push({ text: `${label}: page error: ${e.error().stack ?? e.error()}` }));
  context.on("console", (msg) => {
    const { url } = msg.location();
    if (msg.type() !== "error") return;
    const status = msg.text().match(/^Failed to load resource: the server responded with a status of (\d+)/)?.[1];
    problems.push({ text: `${label}: console error at ${url}: ${msg.text()}`, excuse: status && `${status} ${url}` });
  });
  return { label, context, page: await context.newPage() };
}

/** Signs in through the login form; `screenshot` is taken with the form filled, before submitting. */
async function signIn({ context, page }, token, name, screenshot) {
  await open(page, "/console/login");
  const csrf = await page.inputValue("form#login input[name=csrf]");
  const login = await cookie(context, "gavel_login");
  check(login && login.value === csrf, "the login form carries the gavel_login cookie as its csrf field");
  const field = "form#login input[name=token]";
  check((await page.getAttribute(field, "type")) === "password", "the token field is a password field");
  await page.fill(field, token);
  if (screenshot) await shot(page, screenshot);
  await navigate(page, () => page.click("form#login button[type=submit]"));
  check(pathOf(page) === "/console/queue", `signed in as ${name}, landed on ${page.url()}`);
  const whoami = (await page.textContent("#whoami")) ?? "";
  check(new RegExp(`(^|\\W)${name}(\\W|$)`).test(whoami.trim()), `#whoami says ${JSON.stringify(whoami)}, not ${name}`);
  const session = await cookie(context, "gavel_session");
  check(
    session?.httpOnly && session.sameSite === "Strict",
    `the session cookie is not HttpOnly and SameSite=Strict: ${JSON.stringify(session)}`,
  );
}

const A = await newContext("A");
const B = await newContext("B");
const pageA = A.page;
const pageB = B.page;
mkdirSync(shots, { recursive: true });

try {
  step("a. a client token is refused; mod signs in");
  await open(pageA, "/console/login");
  await pageA.fill("form#login input[name=token]", clientToken);
  await navigate(pageA, () => pageA.click("form#login button[type=submit]"), 401);
  await pageA.locator("#error").waitFor({ state: "visible" });
  check(!(await cookie(A.context, "gavel_session")), "a client token got a session");
  await signIn(A, modToken, "mod", "login.png");
  await shot(pageA, "queue.png");

  step("b. a POST without the CSRF token is refused and changes nothing");
  const before = await apiItem(xssItem);
  check(before.status === "held_for_review", `the XSS item is ${before.status}, not held_for_review`);
  // The item's real version: were the CSRF check missing, this decision would go through.
  for (const csrf of [null, "not-the-token"]) {
    const form = { status: "visible", reason: "x", version: String(before.version) };
    if (csrf) form.csrf = csrf;
    const r = await A.context.request.post(`${base}${itemPath(xssItem)}/decide`, { form, maxRedirects: 0 });
    check(r.status() === 403, `a decision with csrf ${csrf} answered ${r.status()}, not 403`);
    check((await r.text()).includes("CSRF"), "the 403 page says CSRF");
  }
  const after = await apiItem(xssItem);
  check(
    after.status === "held_for_review" && after.version === before.version,
    `the refused POSTs changed the item: ${after.status} v${after.version}`,
  );

  step("c. mod2 signs in; both start reviewing at the same moment");
  await signIn(B, mod2Token, "mod2");
  await Promise.all([navigate(pageA, () => pageA.click("#start")), navigate(pageB, () => pageB.click("#start"))]);
  const claimed = [itemOf(pageA), itemOf(pageB)];
  check(claimed[0] && claimed[1], `both land on an item page: ${pageA.url()}, ${pageB.url()}`);
  check(claimed[0] !== claimed[1], `both moderators were given item ${claimed[0]}`);
  const [keyboardItem, staleItem] = claimed;
  check(!claimed.includes(xssItem), XSS_CLAIMED);

  step("d. the item text is shown, never interpreted");
  await open(pageA, itemPath(xssItem));
  const text = (await pageA.textContent("#item-text")) ?? "";
  check(
    text.includes(XSS_IMG) && text.includes(XSS_SCRIPT),
    `#item-text lacks the raw markup: ${JSON.stringify(text)}`,
  );
  check((await pageA.locator("#item-text img").count()) === 0, "an <img> inside #item-text");
  check((await pageA.locator("#item-text script").count()) === 0, "a <script> inside #item-text");
  check((await pageA.locator("[onerror]").count()) === 0, "an element with an onerror attribute on the page");
  await shot(pageA, "item.png");

  step(`e. a decision by keyboard on ${keyboardItem}`);
  await open(pageA, itemPath(keyboardItem));
  const shortcuts = pageA.locator("#shortcuts");
  check(!(await shortcuts.isVisible()), "#shortcuts is shown before ? is pressed");
  await pageA.keyboard.press("?");
  await shortcuts.waitFor({ state: "visible" });
  await pageA.keyboard.press("?");
  await shortcuts.waitFor({ state: "hidden" });
  await statusKey(pageA, "v", "visible");
  // The reason holds h, s and d: typed into the field, they are text, not shortcuts.
  const reason = "not spam, checked by hand";
  await pageA.keyboard.type(reason);
  check((await pageA.inputValue("#reason")) === reason, "the reason was typed into #reason");
  check(await pageA.isChecked("#status-visible"), "typing the reason changed the chosen status");
  await navigate(pageA, () => pageA.keyboard.press("Control+Enter"));
  check(itemOf(pageA) === keyboardItem, `Ctrl+Enter stays on the item, landed on ${pageA.url()}`);
  check((await statusOf(pageA)) === "visible", `${keyboardItem} is ${await statusOf(pageA)} after the decision`);
  check(((await pageA.textContent("#flash")) ?? "").includes("Decided"), "#flash says Decided");

  step(`f. another moderator's claim holds, then a decision from a stale page (${staleItem}) is refused`);
  await open(pageB, itemPath(staleItem));
  await open(pageA, itemPath(staleItem));
  await pageA.click("#status-rejected");
  await pageA.fill("#reason", "spam, rejected by mod");
  await navigate(pageA, () => pageA.click("#submit"), 409);
  check(((await pageA.textContent("#error")) ?? "").includes("mod2 is reviewing"), "mod2's claim is named");
  check((await statusOf(pageA)) === "held_for_review", `a claimed item was decided: ${await statusOf(pageA)}`);
  await pageA.click("#status-rejected");
  await pageA.check("#override");
  await pageA.fill("#reason", "spam, rejected by mod");
  await navigate(pageA, () => pageA.click("#submit"));
  check((await statusOf(pageA)) === "rejected", `mod's decision left ${staleItem} ${await statusOf(pageA)}`);
  await pageB.click("#status-visible");
  await pageB.fill("#reason", "fine, says mod2 from a stale page");
  await navigate(pageB, () => pageB.click("#submit"), 409);
  await pageB.locator("#conflict").waitFor({ state: "visible" });
  check((await statusOf(pageB)) === "rejected", `the conflict page shows ${await statusOf(pageB)}, not rejected`);
  await shot(pageB, "conflict.png");

  step("g. submit & next");
  const first = await startReviewing(pageA);
  check(first, "start reviewing found the queue empty");
  check(first !== xssItem, XSS_CLAIMED);
  await statusKey(pageA, "r", "rejected");
  await pageA.keyboard.type("spam, rejected with submit and next");
  await navigate(pageA, () => pageA.keyboard.press("Control+Shift+Enter"));
  const next = await nextItemOrEmpty(pageA);
  check(next !== first, `submit & next came back to ${first}`);
  const decided = await apiItem(first);
  check(decided.status === "rejected", `${first} is ${decided.status} after submit & next`);

  step("h. a skipped item is not offered again");
  const skipped = await startReviewing(pageB);
  check(skipped, "start reviewing found the queue empty");
  await navigate(pageB, () => pageB.click("form#skip button"));
  check((await nextItemOrEmpty(pageB)) !== skipped, `skip came back to ${skipped}`);
  check((await startReviewing(pageB)) !== skipped, `start reviewing offered the skipped ${skipped} again`);

  step("i. plugins, operations and search");
  await open(pageA, "/console/plugins");
  check((await pageA.locator("svg#reversal-chart").count()) === 1, "no svg#reversal-chart");
  check((await pageA.locator("table#plugins").count()) === 1, "no table#plugins");
  check((await pageA.locator("table#plugins tr[data-plugin]").count()) > 0, "no plugin rows");
  await shot(pageA, "plugins.png");
  await open(pageA, "/console/operations");
  check((await pageA.locator("#dead-letters").count()) === 1, "no #dead-letters");
  check((await pageA.locator("#deliveries").count()) === 1, "no #deliveries");
  await shot(pageA, "operations.png");
  await open(pageA, `/console/search?q=${encodeURIComponent(xssItem)}`);
  const rows = pageA.locator("tr[data-item]");
  check((await rows.count()) === 1, `searching the XSS item's id found ${await rows.count()} rows`);
  check((await rows.first().getAttribute("data-item")) === xssItem, "the search row is the XSS item");
  await shot(pageA, "search.png");

  step("i2. lists: add and remove with a reason, history, diff, a stale edit refused");
  const list = "console-terms";
  const created = await fetch(`${base}/v1/lists/${list}`, {
    method: "PUT",
    headers: { Authorization: `Bearer ${modToken}`, "Content-Type": "application/json" },
    body: JSON.stringify({
      kind: "terms",
      reason: "seeded by the browser test",
      entries: [{ value: "free money", note: XSS_SCRIPT }, { value: "crypto giveaway" }],
    }),
  });
  check(created.status === 201, `creating list ${list} answered ${created.status}`);
  const listPath = `/console/lists/${list}`;
  const versionShown = async (page) => Number(await page.locator("#list-version").getAttribute("data-version"));
  await open(pageA, "/console/lists");
  check((await pageA.locator(`tr[data-list="${list}"]`).count()) === 1, `no row for ${list} on /console/lists`);
  await shot(pageA, "lists.png");
  await navigate(pageA, () => pageA.click(`tr[data-list="${list}"] a`));
  check(pathOf(pageA) === listPath, `the list link led to ${pageA.url()}`);
  check((await versionShown(pageA)) === 1, "the new list is not at version 1");
  check((await pageA.locator("table#entries tr[data-entry]").count()) === 2, "the list does not show its 2 entries");
  await pageA.fill("form#add-entry input[name=value]", "win a prize");
  await pageA.fill("form#add-entry input[name=note]", "seen in a spam wave");
  await pageA.fill("form#add-entry input[name=reason]", "a new scam phrase");
  await navigate(pageA, () => pageA.click("form#add-entry button"));
  check(pathOf(pageA) === listPath, `adding an entry landed on ${pageA.url()}`);
  check((await versionShown(pageA)) === 2, "adding an entry did not make version 2");
  check((await pageA.locator('tr[data-entry="win a prize"]').count()) === 1, "the added entry is not listed");
  await open(pageA, `${listPath}?q=prize`);
  check((await pageA.locator("table#entries tr[data-entry]").count()) === 1, "searching 'prize' did not find one entry");
  await open(pageA, listPath);
  const giveaway = pageA.locator('tr[data-entry="crypto giveaway"]');
  await giveaway.locator("input[name=reason]").fill("no longer seen");
  await navigate(pageA, () => giveaway.locator("button").click());
  check((await versionShown(pageA)) === 3, "removing an entry did not make version 3");
  check((await pageA.locator('tr[data-entry="crypto giveaway"]').count()) === 0, "the removed entry is still listed");
  check((await pageA.locator("table#versions tr[data-version]").count()) === 3, "the history does not show 3 versions");
  await shot(pageA, "list.png");
  await navigate(pageA, () => pageA.click('table#versions tr[data-version="3"] a.diff'));
  const removedRow = pageA.locator("table#diff tr.removed");
  check((await removedRow.count()) === 1, "the diff of version 3 does not show one removed entry");
  check((await removedRow.textContent()).includes("crypto giveaway"), "the diff names another entry");
  await shot(pageA, "list-diff.png");
  // B opens version 3; A edits; B's edit, based on version 3, is refused.
  await open(pageB, listPath);
  await open(pageA, listPath);
  await pageA.fill("form#add-entry input[name=value]", "claim your reward");
  await pageA.fill("form#add-entry input[name=reason]", "another phrase");
  await navigate(pageA, () => pageA.click("form#add-entry button"));
  check((await versionShown(pageA)) === 4, "A's edit did not make version 4");
  await pageB.fill("form#add-entry input[name=value]", "stale phrase");
  await pageB.fill("form#add-entry input[name=reason]", "based on version 3");
  await navigate(pageB, () => pageB.click("form#add-entry button"), 409);
  check(
    ((await pageB.locator("#error").textContent()) || "").includes("changed since"),
    "the stale edit's page does not say the list changed",
  );
  const now = await (
    await fetch(`${base}/v1/lists/${list}`, { headers: { Authorization: `Bearer ${modToken}` } })
  ).json();
  check(now.version === 4, `the list is at version ${now.version} after the refused edit`);
  check(!now.entries.some((e) => e.value === "stale phrase"), "the refused edit was written");

  step(`k. appeals: mod2 takes the appeal on ${appealItem}, mod finds none left, mod2 overturns it by keyboard`);
  await open(pageA, "/console/appeals");
  const row = pageA.locator(`#appeals tr[data-item="${appealItem}"]`);
  check((await row.count()) === 1, `the appeal on ${appealItem} is not in the queue`);
  await open(pageB, "/console/appeals");
  await navigate(pageB, () => pageB.click("#take"));
  check(pathOf(pageB).startsWith("/console/appeals/"), `taking the next appeal landed on ${pageB.url()}`);
  check(((await pageB.textContent("#appeal-text")) ?? "").includes("warning people"), "the appellant's words are shown");
  check((await pageB.getAttribute("#appeal-status", "data-status")) === "open", "the appeal is open");
  check(((await pageB.textContent("#statement")) ?? "").includes("banned-terms"), "the statement names the rule");
  // mod2 holds the only appeal: mod is told none is left.
  await open(pageA, "/console/appeals");
  await navigate(pageA, () => pageA.click("#take"));
  await pageA.locator("#appeals-empty").waitFor({ state: "visible" });
  // By keyboard: o chooses overturn and focuses the reason; Ctrl+Enter decides.
  await pageB.keyboard.press("o");
  await until("o to check #outcome-overturn and focus #reason", async () => {
    const focused = await pageB.evaluate(() => document.activeElement?.id);
    return focused === "reason" && (await pageB.isChecked("#outcome-overturn"));
  });
  await pageB.keyboard.type("a warning about scams, not one");
  check(await pageB.isChecked("#outcome-overturn"), "typing the reason changed the outcome");
  await navigate(pageB, () => pageB.keyboard.press("Control+Enter"));
  check((await pageB.getAttribute("#appeal-status", "data-status")) === "overturned", "the appeal is not overturned");
  await shot(pageB, "appeal.png");
  // The outcome on the item's timeline: the moderator's transition, cause appeal.
  await navigate(pageB, () => pageB.click("#appeal-item"));
  check((await statusOf(pageB)) === "visible", `the overturned item is ${await statusOf(pageB)}`);
  const outcome = pageB.locator('#timeline li[data-kind="transition"]', { hasText: "appeal" });
  check((await outcome.count()) === 1, "the appeal's transition is not on the timeline once");
  check(((await outcome.textContent()) ?? "").includes("mod2"), "the timeline names mod2");

  step("j. sign out");
  const session = await cookie(A.context, "gavel_session");
  // The contract names the form, not its control.
  await navigate(pageA, () => pageA.click("form#logout :is(button, input[type=submit])"));
  check(pathOf(pageA) === "/console/login", `signing out landed on ${pageA.url()}`);
  await open(pageA, "/console/queue");
  check(pathOf(pageA) === "/console/login", `after signing out /console/queue showed ${pageA.url()}`);
  // The server forgot the session, not only the browser.
  const replay = await fetch(`${base}/console/queue`, {
    headers: { Cookie: `gavel_session=${session.value}` },
    redirect: "manual",
  });
  check(
    replay.status === 303 && new URL(replay.headers.get("location"), base).pathname === "/console/login",
    `the old session cookie still opens the queue (${replay.status})`,
  );
  clean();

  console.log(
    JSON.stringify({ keyboard_decided: keyboardItem, stale_item: staleItem, claimed, skipped, appeal_overturned: appealItem }),
  );
} catch (e) {
  console.error(`e2e: FAILED in step ${current}:\n${e instanceof CheckFailed ? e.message : e.stack}`);
  const left = unexcused();
  if (left.length && e.message !== left.join("\n")) console.error(`also:\n${left.join("\n")}`);
  for (const { label, page } of [A, B]) {
    await shot(page, `failure-${label}.png`).catch(() => {});
  }
  process.exitCode = 1;
} finally {
  await browser.close();
}
