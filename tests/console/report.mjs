// The HTML page of a backtest report (host/src/backtest/html.rs) in a real
// browser: Debian's Chromium driven through playwright-core, the page opened
// from disk as a mail attachment would be. It must be self-contained (no
// request but file: and data:), raise no error, and draw its charts.
//
//   node report.mjs REPORT.html SCREENSHOT.png
//
//   CHROMIUM  the browser (default /usr/bin/chromium)
//
// Stdout gets one JSON line {"ok", "svgs", "title", "errors"}; the exit code
// is 0 only when ok. Failures are explained on stderr.

import { chromium } from "playwright-core";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const TIMEOUT_MS = 30_000;
const MIN_SVGS = 3;

const [reportArg, shotArg] = process.argv.slice(2);
if (!reportArg || !shotArg) {
  console.error("usage: node report.mjs REPORT.html SCREENSHOT.png");
  process.exit(2);
}
const reportPath = resolve(reportArg);
if (!existsSync(reportPath)) {
  console.error(`report: no such file: ${reportPath}`);
  process.exit(2);
}
const shotPath = resolve(shotArg);
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";

/** Everything that went wrong, in the order seen. */
const errors = [];
const local = (url) => url.startsWith("file:") || url.startsWith("data:");

const result = { ok: false, svgs: 0, title: null, errors };
let browser;
try {
  browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
  const context = await browser.newContext();
  context.setDefaultTimeout(TIMEOUT_MS);
  context.setDefaultNavigationTimeout(TIMEOUT_MS);
  const page = await context.newPage();
  page.on("console", (msg) => {
    if (msg.type() === "error") errors.push(`console error: ${msg.text()}`);
  });
  page.on("pageerror", (e) => errors.push(`page error: ${e.stack ?? e}`));
  page.on("dialog", (dialog) => {
    errors.push(`a ${dialog.type()} dialog opened: ${dialog.message()}`);
    dialog.dismiss().catch(() => {});
  });
  page.on("requestfailed", (req) => errors.push(`request failed: ${req.url()} (${req.failure()?.errorText ?? "?"})`));
  page.on("request", (req) => {
    if (!local(req.url())) errors.push(`external request (the report must be self-contained): ${req.url()}`);
  });

  await page.goto(pathToFileURL(reportPath).href, { waitUntil: "load" });

  result.title = await page.title();
  if (!result.title.startsWith("Backtest")) errors.push(`the title is ${JSON.stringify(result.title)}, not "Backtest…"`);

  const svgs = page.locator("svg");
  const count = await svgs.count();
  for (let i = 0; i < count; i++) {
    const svg = svgs.nth(i);
    const name = (await svg.getAttribute("aria-label")) ?? (await svg.getAttribute("id")) ?? `svg #${i + 1}`;
    const box = await svg.boundingBox();
    if (!(await svg.isVisible())) {
      errors.push(`chart not visible: ${name}`);
    } else if (!box || !(box.width > 0) || !(box.height > 0)) {
      errors.push(`chart has an empty bounding box: ${name} ${JSON.stringify(box)}`);
    } else {
      result.svgs += 1;
    }
  }
  if (result.svgs < MIN_SVGS) errors.push(`${result.svgs} visible charts with a size, at least ${MIN_SVGS} expected`);

  await page.screenshot({ path: shotPath, fullPage: true });
  // Late events (a lazy request, an error in a handler) still count.
  await page.waitForTimeout(200);
} catch (e) {
  errors.push(`report check aborted: ${e.stack ?? e}`);
} finally {
  await browser?.close().catch(() => {});
}

result.ok = errors.length === 0;
console.log(JSON.stringify(result));
if (!result.ok) {
  console.error(`report: FAILED for ${reportPath}:\n${errors.join("\n")}`);
  process.exitCode = 1;
}
