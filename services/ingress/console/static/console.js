// The console's only script (the Content-Security-Policy allows no other): answer forms are
// sent once, the inbox and a proposal's outcome follow what happens elsewhere by polling.
"use strict";

function sendOnce(form) {
  form.addEventListener("submit", (event) => {
    if (form.dataset.sent) {
      event.preventDefault();
      return;
    }
    form.dataset.sent = "1";
    // Disabled after the form's data is taken: the pressed button's value is still sent.
    setTimeout(() => form.querySelectorAll("button").forEach((b) => { b.disabled = true; }), 0);
  });
}

async function fetchText(url) {
  const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  return response.ok ? response.text() : null;
}

function pollInbox(rows) {
  setInterval(async () => {
    const text = await fetchText(rows.dataset.poll).catch(() => null);
    if (text !== null && text !== rows.dataset.last) {
      // Keep the keyboard where it was: the link that had focus, if it is still listed.
      const focused = rows.contains(document.activeElement)
        ? document.activeElement.getAttribute("href")
        : null;
      rows.dataset.last = text;
      rows.innerHTML = text;
      // The count the rows are part of: the heading line follows it.
      const now = rows.querySelector("#inbox-count-now");
      const line = document.getElementById("inbox-count");
      if (now && line && line.textContent !== now.dataset.count) {
        line.textContent = now.dataset.count;
      }
      if (focused !== null) {
        const again = Array.from(rows.querySelectorAll("a")).find(
          (a) => a.getAttribute("href") === focused,
        );
        if (again) again.focus();
      }
    }
  }, 2000);
}

// A region that outlives the boxes it speaks for: screen readers announce what it says.
function announce(text) {
  let region = document.getElementById("announce");
  if (!region) {
    region = document.createElement("p");
    region.id = "announce";
    region.className = "visually-hidden";
    region.setAttribute("role", "status");
    region.setAttribute("aria-live", "polite");
    document.body.appendChild(region);
  }
  region.textContent = text;
}

function followOutcome(box) {
  const timer = setInterval(async () => {
    const text = await fetchText(box.dataset.poll).catch(() => null);
    if (text === null) return;
    const holder = document.createElement("div");
    holder.innerHTML = text;
    const fresh = holder.firstElementChild;
    if (!fresh) return;
    const changed = fresh.textContent !== box.textContent;
    box.replaceWith(fresh);
    box = fresh;
    if (changed) announce(fresh.textContent);
    if (!fresh.classList.contains("state-pending")) {
      // Answered here or elsewhere: the forms no longer apply.
      document.querySelectorAll("form.answer").forEach((f) => f.remove());
    }
    if (fresh.dataset.final === "true") clearInterval(timer);
  }, 1000);
}

function followRun(status) {
  const timer = setInterval(async () => {
    const text = await fetchText(status.dataset.poll).catch(() => null);
    if (text === null) return;
    const holder = document.createElement("div");
    holder.innerHTML = text;
    const fresh = holder.firstElementChild;
    if (fresh && fresh.dataset.status !== status.dataset.status) {
      clearInterval(timer);
      window.location.reload();  // the timeline and the actions moved with it
    }
  }, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("form[data-once]").forEach(sendOnce);
  const rows = document.getElementById("inbox-rows");
  if (rows) pollInbox(rows);
  const box = document.getElementById("outcome");
  if (box && box.dataset.final !== "true") followOutcome(box);
  const run = document.getElementById("run-status");
  if (run && !["succeeded", "failed", "cancelled"].includes(run.dataset.status)) followRun(run);
});
