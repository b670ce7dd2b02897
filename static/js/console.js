// The console's own behaviour, as a static file: the Content-Security-Policy allows no inline
// script (no <script> body, no on…= or hx-on attribute), so what the pages need beyond htmx's
// attributes lives here.
//
// A refused console action answers 4xx with an X-Console-Notice header and the notice as its
// body. htmx does not swap an error answer by default; inside an element marked
// data-swap-notices (the review queue, a run page) it is swapped like a success, so the
// notice shows where the action was.
document.addEventListener("htmx:beforeSwap", (event) => {
  const detail = event.detail;
  if (!(event.target instanceof Element) || !event.target.closest("[data-swap-notices]")) return;
  if (detail.xhr && detail.xhr.getResponseHeader("X-Console-Notice")) {
    detail.shouldSwap = true;
    detail.isError = false;
  }
});

// The pending-approval panel reloads itself (hx-trigger="pending-changed") when a live update
// says the open set changed elsewhere (another tab, the API, the CLI, a run): the count pushed
// into #live-queue differs from the one the panel shows (both past the cap count as equal).
// Not while an action of the panel is in flight: replacing its form would drop the action's
// answer, which brings the count itself.
document.addEventListener("htmx:oobAfterSwap", (event) => {
  const target = event.target; // the element swapped in, with the pushed counts
  if (!(target instanceof Element) || target.id !== "live-queue") return;
  const panel = document.getElementById("pending-panel");
  const summary = document.getElementById("pending-summary");
  if (!panel || !summary || panel.querySelector(".htmx-request")) return;
  // The pushed count is capped (data-cap: past it, it reads cap + 1); the panel's is exact.
  const cap = Number(target.dataset.cap);
  const pushed = Number(target.dataset.proposals);
  const shown = Number(summary.dataset.open);
  if (pushed !== shown && !(pushed > cap && shown > cap)) htmx.trigger(panel, "pending-changed");
});

// A run page follows its run live: the pushed progress fragment (#run-progress-<id>) says
// where the run is; once it says the run ended while the page still shows it queued or
// running, the run section reloads itself (hx-trigger="run-ended") to show the counts, the
// affected entries and the revert of the finished run.
document.addEventListener("htmx:oobAfterSwap", (event) => {
  const target = event.target;
  if (!(target instanceof Element) || !target.id.startsWith("run-progress-")) return;
  if (target.dataset.ended !== "1") return;
  const section = document.getElementById("run");
  if (!section || section.dataset.run !== target.id.slice("run-progress-".length)) return;
  if (section.dataset.status === "queued" || section.dataset.status === "running") {
    htmx.trigger(section, "run-ended");
  }
});

// A filter form marked data-refresh-on-select applies itself when one of its menus changes
// (hx-trigger="submit, select-changed"); typed fields wait for the submit.
document.addEventListener("change", (event) => {
  const field = event.target;
  if (!(field instanceof HTMLSelectElement)) return;
  const form = field.closest("form[data-refresh-on-select]");
  if (form) htmx.trigger(form, "select-changed");
});

// An address htmx is about to push that is the one shown already is no new step of history:
// it replaces it instead. Pressing Filter after one of the form's menus applied it asks for the
// same address again; pushed, it made two steps of one filter, and the first Back went nowhere.
// (htmx reads the update's type after this event: the detail holds the object itself.)
document.addEventListener("htmx:beforeHistoryUpdate", (event) => {
  const update = event.detail.history;
  if (!update || update.type !== "push") return;
  const next = new URL(update.path, location.href);
  if (next.pathname === location.pathname && next.search === location.search) update.type = "replace";
});

// A form that gets (the filters of the review queue, the runs, the entries) sends only the
// fields it has a value in: an empty one is "any", no filter, and would only clutter the
// request and the address it pushes (?tab=hygiene&recommendation=&reason=); the server
// reads a missing field as an empty one. Not the values of the request's own URL (a pager
// link's), nor any other request's.
document.addEventListener("htmx:configRequest", (event) => {
  const detail = event.detail;
  if (detail.verb !== "get" || !(detail.elt instanceof HTMLFormElement)) return;
  const params = detail.parameters;
  for (const name of Array.from(new Set(params.keys()))) {
    if (params.getAll(name).every((value) => value === "")) params.delete(name);
  }
});

// A live update carries every fragment any console page may show (queue counts, the dashboard's
// panels, the header); a page shows only some of them. htmx reports an out-of-band fragment
// whose target is absent as an error (htmx:oobErrorNoTarget): this extension of the live
// connection (hx-ext="ws, present-targets") drops those fragments before htmx swaps the rest.
function hasTarget(fragment) {
  const oob = fragment.getAttribute("hx-swap-oob") || "true";
  const colon = oob.indexOf(":");
  if (colon >= 0) return document.querySelector(oob.slice(colon + 1).trim()) !== null;
  if (fragment.tagName === "TEMPLATE" || !fragment.id) return true;
  return document.getElementById(fragment.id) !== null;
}

htmx.defineExtension("present-targets", {
  transformResponse: (text) => {
    const holder = document.createElement("template");
    holder.innerHTML = text;
    const absent = Array.from(holder.content.children).filter((child) => !hasTarget(child));
    if (!absent.length) return text;
    absent.forEach((child) => child.remove());
    return holder.innerHTML;
  },
});
