// gavel moderator console: keyboard shortcuts and the review claim's
// heartbeat. Loaded from /console/assets (the content security policy
// allows no inline script); every page works without it.
"use strict";

(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content;
  const decide = document.getElementById("decide");
  const reason = document.getElementById("reason");
  const shortcuts = document.getElementById("shortcuts");
  const skip = document.getElementById("skip");

  // While someone is working on this page, keep the claim on its item
  // alive; a forgotten tab lets it lapse, and the item goes to others.
  const renew = decide?.dataset.renew;
  let lastActive = Date.now();
  for (const kind of ["keydown", "pointerdown", "pointermove", "scroll"]) {
    document.addEventListener(kind, () => (lastActive = Date.now()), { passive: true });
  }
  if (renew && csrf) {
    const IDLE_MS = 5 * 60000;
    const beat = () => {
      if (document.hidden || Date.now() - lastActive > IDLE_MS) return;
      fetch(renew, { method: "POST", headers: { "X-CSRF-Token": csrf }, credentials: "same-origin" })
        .then((r) => r.json())
        .then((answer) => {
          if (!answer.claimed) {
            const claim = document.getElementById("claim");
            if (claim) claim.textContent = "This item is no longer claimed by you: it was decided, or your claim lapsed.";
          }
        })
        .catch(() => {});
    };
    setInterval(beat, 60000);
  }

  function submit(then) {
    if (!decide) return;
    const button = decide.querySelector(`button[name="then"][value="${then}"]`);
    if (decide.reportValidity()) decide.requestSubmit(button);
  }

  function choose(id) {
    const radio = document.getElementById(id);
    if (!radio) return false;
    radio.checked = true;
    reason?.focus();
    return true;
  }

  // An item's decision (status-*) and an appeal's (outcome-*).
  const keys = {
    v: "status-visible",
    h: "status-held_for_review",
    r: "status-rejected",
    d: "status-deleted",
    u: "outcome-uphold",
    o: "outcome-overturn",
  };

  document.addEventListener("keydown", (e) => {
    const typing = e.target instanceof HTMLElement && e.target.matches("input, textarea, select");
    // Ctrl+Enter decides from the decision form or from no form at all,
    // never from another form (the search box).
    const otherForm = e.target instanceof Element && e.target.closest("form") && !e.target.closest("#decide");
    if (e.key === "Enter" && e.ctrlKey && decide && !otherForm) {
      e.preventDefault();
      submit(e.shiftKey ? "next" : "stay");
      return;
    }
    if (typing) {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === "?") {
      if (shortcuts) shortcuts.hidden = !shortcuts.hidden;
      e.preventDefault();
    } else if (keys[e.key] && decide) {
      if (choose(keys[e.key])) e.preventDefault();
    } else if (e.key === "s" && skip) {
      e.preventDefault();
      skip.requestSubmit();
    }
  });
})();
