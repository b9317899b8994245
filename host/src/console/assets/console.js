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

  // While this page is open, keep the claim on its item alive.
  const renew = decide?.dataset.renew;
  if (renew && csrf) {
    const beat = () =>
      fetch(renew, { method: "POST", headers: { "X-CSRF-Token": csrf }, credentials: "same-origin" })
        .then((r) => {
          if (r.status === 409) {
            const claim = document.getElementById("claim");
            if (claim) claim.textContent = "Your claim on this item lapsed; another moderator may be reviewing it.";
          }
        })
        .catch(() => {});
    setInterval(beat, 60000);
  }

  function submit(then) {
    if (!decide) return;
    const button = decide.querySelector(`button[name="then"][value="${then}"]`);
    if (decide.reportValidity()) decide.requestSubmit(button);
  }

  function choose(status) {
    const radio = document.getElementById(`status-${status}`);
    if (!radio) return;
    radio.checked = true;
    reason?.focus();
  }

  const keys = { v: "visible", h: "held_for_review", r: "rejected", d: "deleted" };

  document.addEventListener("keydown", (e) => {
    const typing = e.target instanceof HTMLElement && e.target.matches("input, textarea, select");
    if (e.key === "Enter" && e.ctrlKey && decide) {
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
      choose(keys[e.key]);
      e.preventDefault();
    } else if (e.key === "s" && skip) {
      e.preventDefault();
      skip.requestSubmit();
    }
  });
})();
